"""The real Slurm cluster of tests/slurm/: the one `bash scripts/slurm_local.sh` starts (SLURM_CONF names it), or any
cluster this machine's `sinfo` answers for. Without one the tests are skipped; with TRL_GROUPOPT_REQUIRE_SLURM=1 (CI's
Slurm stage) a missing cluster or submitit is an error. Nothing here mocks Slurm or submitit."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REQUIRE_SLURM_ENV = "TRL_GROUPOPT_REQUIRE_SLURM"


def _cluster_problem() -> str | None:
    try:
        import submitit  # noqa: F401
    except ImportError:
        return 'submitit is not installed (pip install "trl-groupopt[slurm]")'
    if shutil.which("sinfo") is None:
        return "no Slurm commands on the PATH (bash scripts/slurm_local.sh python -m pytest tests/slurm starts one)"
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=60)
    if proc.returncode or "idle" not in proc.stdout and "mix" not in proc.stdout:
        return f"no idle Slurm node answers sinfo ({(proc.stderr or proc.stdout).strip()[-200:]})"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A Slurm cluster that takes jobs now; skips (or fails, under TRL_GROUPOPT_REQUIRE_SLURM=1) without one."""
    problem = _cluster_problem()
    if problem and os.environ.get(REQUIRE_SLURM_ENV):
        pytest.fail(f"{REQUIRE_SLURM_ENV} is set but {problem}")
    if problem:
        pytest.skip(problem)
