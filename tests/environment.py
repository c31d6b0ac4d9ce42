"""The one place the tests' offline environment is defined: no Hub access, no tokenizer threads, no experiment
tracker, one OpenMP thread (the CI machine has 2 cores). `tests/conftest.py` applies it to the test process; a test
that launches a process (torchrun, `accelerate launch`, a notebook kernel, `python -c`) passes `process_environment()`.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_DISABLED": "true",
    "OMP_NUM_THREADS": "1",
}


def set_offline_environment() -> None:
    """Make this process offline (called once, by `tests/conftest.py`, before torch or transformers is imported)."""
    os.environ.update(OFFLINE_ENVIRONMENT)


def process_environment(**extra: str) -> dict[str, str]:
    """The environment for a launched process: this one's, offline, with this repository first on PYTHONPATH (so the
    child imports this checkout's `trl_groupopt` and `tests`), plus `extra`."""
    env = dict(os.environ)
    env.update(OFFLINE_ENVIRONMENT)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env
