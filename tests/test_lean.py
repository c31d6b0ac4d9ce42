"""What importing costs, and how long functions may grow.

- The pure math (`trl_groupopt.objectives` and each objective module) imports no TRL, transformers or accelerate.
- `import trl_groupopt` and the registry's method table (names, papers, summaries) import no TRL; a trainer class does.
- The CLI answers `--help`, `methods`, `train --help`, an unknown `--method` and a missing `--config` file without
  importing TRL.
- No function in `trl_groupopt/` or `scripts/` is longer than 80 lines (`scripts/check_function_length.py`).

Each check runs in a fresh interpreter: this test process has imported TRL long ago.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("trl", "transformers", "accelerate")


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _heavy_modules_after(code: str) -> list[str]:
    """The TRL / transformers / accelerate modules in `sys.modules` after `code` ran in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    proc = _run(probe)
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["objectives", "objectives.common", "objectives.echo", "objectives.dfpo",
                                    "objectives.ctpo", "objectives.otb"])  # fmt: skip
def test_objectives_import_no_trl(module):
    assert _heavy_modules_after(f"import trl_groupopt.{module}") == []


def test_package_and_method_table_import_no_trl():
    code = (
        "import trl_groupopt\n"
        "specs = list(trl_groupopt.METHODS.values())\n"
        "assert {'grpo', 'echo', 'dfpo', 'grpo_fix', 'ctpo', 'otb'} <= set(trl_groupopt.METHODS)\n"
        "assert all(s.summary and str(s.paper) and s.trainer_name.endswith('Trainer') for s in specs)\n"
    )
    assert _heavy_modules_after(code) == []
    # ...and reading a trainer class imports it (and TRL) on first use
    assert "trl" in _heavy_modules_after("import trl_groupopt\ntrl_groupopt.METHODS['ctpo'].trainer_class")
    assert "trl" in _heavy_modules_after("from trl_groupopt import ECHOConfig")


@pytest.mark.parametrize(
    "argv,exit_code,says",
    [
        (["--help"], 0, "methods:"),
        (["methods"], None, "OTBTrainer"),
        (["train", "--help"], 0, "--method NAME --help"),
        (["train", "--method", "nonsense"], 2, "invalid choice: 'nonsense'"),
        (["train", "--method", "echo", "--config", "missing.yaml"], 2, "--config missing.yaml: no such file"),
    ],
)
def test_cli_answers_without_importing_trl(argv, exit_code, says):
    code = (
        "import contextlib, io, sys\n"
        "from trl_groupopt.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "        code = None\n"
        "    except SystemExit as exit:\n"
        "        code = exit.code\n"
        f"assert code == {exit_code!r}, (code, out.getvalue())\n"
        f"assert {says!r} in out.getvalue(), out.getvalue()\n"
    )
    assert _heavy_modules_after(code) == []


def test_no_function_over_80_lines():
    proc = subprocess.run(
        [sys.executable, "scripts/check_function_length.py", "trl_groupopt", "scripts"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout


def test_function_length_checker_flags_a_long_function(tmp_path):
    """The checker is not vacuous: an 81-line method is listed by its qualified name, an 80-line function is not."""
    method = ["    def long(self):", *[f"        x{i} = {i}" for i in range(79)], "        return 0"]  # 81 lines
    function = ["def fits():", *[f"    x{i} = {i}" for i in range(78)], "    return 0"]  # 80 lines
    (tmp_path / "code.py").write_text("\n".join(["class A:", *method, "", "", *function, ""]))
    proc = subprocess.run([sys.executable, str(REPO / "scripts/check_function_length.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.splitlines() == [f"{tmp_path / 'code.py'}:2: A.long has 81 lines (> 80)"], proc.stdout
