"""The pure-math layer stands alone: neither `trl_groupopt.core` nor the tests of this folder import TRL,
transformers or accelerate, so they run (and fail) without them and `import trl_groupopt.core` costs nothing.

Three checks: the tests' own import statements (read, not run: fast); a fresh interpreter that imports the objectives
package, each objective module and each test module of this folder, then lists what reached `sys.modules`; and a fresh
interpreter that imports the pure math (`trl_groupopt.core` and each of its modules) and then each pure module of every
method folder, one at a time, recording what each import added: the pure math loads no `trl_groupopt.methods` module
and nothing heavy, no method's objective loads anything heavy (the last two `slow`: they launch a process).
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
CORE_MODULES = ["trl_groupopt.core", *sorted(f"trl_groupopt.core.{p.stem}" for p in (PACKAGE / "core").glob("*.py")
                                             if p.name != "__init__.py")]  # fmt: skip
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


#: A fresh interpreter imports each module in turn and prints, per module, the `trl_groupopt.methods` modules and the
#: heavy packages its import added to `sys.modules`.
_ADDED_BY_EACH = """\
import importlib, json, sys
added = {}
for name in NAMES:
    before = set(sys.modules)
    importlib.import_module(name)
    new = set(sys.modules) - before
    added[name] = {"methods": sorted(m for m in new if m.startswith("trl_groupopt.methods")),
                   "heavy": sorted(m for m in new if m.split(".")[0] in HEAVY)}
print(json.dumps(added))
"""


def _added_by_each(names: list[str]) -> dict[str, dict[str, list[str]]]:
    code = f"NAMES, HEAVY = {names!r}, {HEAVY!r}\n" + _ADDED_BY_EACH
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=process_environment(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow  # launches a Python process
def test_the_pure_math_loads_no_method_and_no_objective_loads_trl():
    method_modules = [m for m in OBJECTIVE_MODULES if m.startswith("trl_groupopt.methods.")]
    assert len(CORE_MODULES) > 3 and any(m.endswith(".objective") for m in method_modules)
    added = _added_by_each([*CORE_MODULES, *method_modules])
    for name in CORE_MODULES:
        assert added[name] == {"methods": [], "heavy": []}, name
    for name in method_modules:
        assert added[name]["heavy"] == [], name
    # the listing is not blind: the registry, in a fresh interpreter, loads every spec and nothing heavy
    (control,) = _added_by_each(["trl_groupopt.methods.registry"]).values()
    assert any(m.endswith(".spec") for m in control["methods"]) and control["heavy"] == []
