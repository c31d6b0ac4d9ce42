"""What importing costs: `import trl_groupopt` and the registry's method table (names, papers, summaries) import no
TRL, a trainer class does; the CLI answers `--help`, `methods`, `train --help`, an unknown `--method` and a missing
`--config` file without importing TRL. (The objectives: `tests/objectives/test_no_trl_import.py`.)

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
        (["train", "--method", "echo", "--config", "missing.yaml"], 2, "--config missing.yaml: no such file"),
    ],
)
def test_cli_answers_without_importing_trl(argv, exit_code, says):
    """`trl-groupopt ARGV` (the console entry point, `trl_groupopt.cli:main`)."""
    code = (
        "import contextlib, io\n"
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


# ---------------------------------------------------------------------------------------------------- cached options
#: What a method's `--help` and the argument errors must not import once its options are cached.
HEAVY_OR_SLOW = (*HEAVY, "torch", "datasets")


@pytest.fixture(scope="module")
def cached_options():
    """Every shipped method's options in the session's cache (`TRL_GROUPOPT_CACHE`, set by tests/conftest.py), as
    the first `--help` or training run leaves them."""
    from trl_groupopt import options

    options.method_options("dfpo")
    return options.cache_dir()


def _door_cases(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    dfpo = ["-m", "trl_groupopt.cli", "train", "--method", "dfpo"]
    return [
        ([*dfpo, "--help"], 0, "--dfpo_transform"),
        (["examples/train_otb.py", "--help"], 0, "usage: train_otb.py"),
        ([*dfpo, "--learnig_rate", "1e-5"], 2, "did you mean --learning_rate?"),
        ([*dfpo, "--dataset_format", "csv"], 2, "invalid choice: 'csv'"),
        ([*dfpo, "--dataset_name", str(tmp_path / "missing.jsonl")], 1, "no such file or folder"),
        ([*dfpo, "--dataset_name", str(empty)], 1, "is empty"),
        ([*dfpo, "--model_name_or_path", "./no-such-model"], 1, "no such folder"),
    ]


def test_method_help_and_argument_errors_answer_in_under_2_cpu_seconds(cached_options, tmp_path):
    """The console commands themselves, in fresh processes: each answers (errors in one line) using under 2 s of CPU
    (user + system, this process's children), without importing TRL, transformers, torch or datasets. A missing or
    empty data file and a missing model folder answer as fast with no cache at all."""
    import resource

    cold = process_environment(TRL_GROUPOPT_CACHE=str(tmp_path / "no-cache-yet"))
    cases = [(case, process_environment()) for case in _door_cases(tmp_path)]
    cases += [(case, cold) for case in _door_cases(tmp_path) if case[1] == 1]
    for (args, status, says), env in cases:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert proc.returncode == status, (args, proc.stderr)
        assert says in proc.stdout + proc.stderr, (args, proc.stdout[:500], proc.stderr)
        if status:
            assert proc.stderr.count("\n") == 1, (args, proc.stderr)
        assert cpu < 2.0, (args, cpu)

    probe = (
        "import sys\n"
        "from trl_groupopt.cli import main\n"
        "for argv in {argvs!r}:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    argvs = [args[2:] for args, _, _ in _door_cases(tmp_path) if args[0] == "-m"]
    proc = subprocess.run([sys.executable, "-c", probe.format(argvs=argvs, heavy=HEAVY_OR_SLOW)], cwd=REPO_ROOT,
                          env=process_environment(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert eval(proc.stdout.strip().splitlines()[-1]) == []
