"""What importing costs: `import trl_groupopt` and the registry's method table (names, papers, summaries) import no
TRL, a trainer class does; the CLI answers `--help`, `methods`, `train --help` and an unknown `--method` without
importing TRL (a method's options are TRL's parser's: tests/test_cli_help.py). (The objectives: `tests/objectives/test_no_trl_import.py`.)

Each check runs in a fresh interpreter: this test process has imported TRL long ago.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.environment import REPO_ROOT, process_environment

HEAVY = ("trl", "transformers", "accelerate")


def _heavy_modules_after(code: str) -> list[str]:
    """The TRL / transformers / accelerate modules in `sys.modules` after `code` ran in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=process_environment(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout.strip().splitlines()[-1])


def test_package_and_method_table_import_no_trl():
    code = (
        "import trl_groupopt\n"
        "specs = list(trl_groupopt.METHODS.values())\n"
        "assert {'grpo', 'echo', 'dfpo', 'grpo_fix', 'ctpo', 'otb'} <= set(trl_groupopt.METHODS)\n"
        "assert all(s.summary and str(s.paper) and s.trainer_name.endswith('Trainer') for s in specs)\n"
    )
    assert _heavy_modules_after(code) == []
    # ...and reading a trainer or config class imports it (and TRL) on first use
    assert "trl" in _heavy_modules_after("import trl_groupopt\ntrl_groupopt.METHODS['ctpo'].trainer_class")
    assert "trl" in _heavy_modules_after("from trl_groupopt import ECHOConfig")


@pytest.mark.parametrize(
    "argv,exit_code,says",
    [
        (["--help"], 0, "methods:"),
        (["methods"], None, "OTBTrainer"),
        (["train", "--help"], 0, "--method NAME --help"),
        (["train", "--method", "nonsense"], 2, "invalid choice: 'nonsense'"),
    ],
)
def test_cli_answers_without_importing_trl(argv, exit_code, says):
    """`trl-groupopt ARGV` (the console entry point, `trl_groupopt.cli.main:main`)."""
    code = (
        "import contextlib, io\n"
        "from trl_groupopt.cli.main import main\n"
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
