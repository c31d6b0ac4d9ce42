"""The pure-math layer stands alone: neither `trl_groupopt.core` nor the tests of this folder import TRL,
transformers or accelerate, so they run (and fail) without them and `import trl_groupopt.core` costs nothing.

Two checks: the tests' own import statements (read, not run: fast), and a fresh interpreter that imports the objectives
package, each objective module and each test module of this folder, then lists what reached `sys.modules` (`slow`:
it launches a process).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT, process_environment

HEAVY = ("trl", "transformers", "accelerate", "peft", "datasets")
HERE = Path(__file__).resolve().parent
TEST_MODULES = sorted(f"tests.objectives.{p.stem}" for p in HERE.glob("test_*.py"))
PACKAGE = REPO_ROOT / "trl_groupopt"
#: The pure math: `core/` and every module of a method's folder but its TRL shell (`trainer.py`).
OBJECTIVE_MODULES = sorted(
    ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts)
    for p in [*(PACKAGE / "core").glob("*.py"), *(PACKAGE / "methods").glob("*/*.py")]
    if p.name not in ("__init__.py", "trainer.py")
)


def _imported_roots(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, at any depth of its code."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module)
    return roots


def test_objective_tests_import_only_the_objectives():
    """No test here imports TRL, transformers, accelerate, the trainers or the heavy test helpers."""
    for path in sorted(HERE.glob("*.py")):
        for module in _imported_roots(path):
            assert module.split(".")[0] not in HEAVY, (path.name, module)
            if module.startswith("trl_groupopt"):
                assert module in OBJECTIVE_MODULES or module == "trl_groupopt.core", (path.name, module)
            assert module != "tests.helpers", (path.name, module)  # builds models and datasets


@pytest.mark.slow  # launches a Python process
def test_importing_the_objectives_imports_no_trl():
    modules = ["trl_groupopt.core", *OBJECTIVE_MODULES, *TEST_MODULES]
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(name for name in {HEAVY!r} if name in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=process_environment(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
