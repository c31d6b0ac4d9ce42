"""Test-wide settings: the offline environment (tests/environment.py), one torch thread, the markers of each layer's
folder, and the guard that keeps the fast selection (`-m "not slow"`) in this process.

| folder | what | marker |
|---|---|---|
| `tests/objectives/` | the pure math: no TRL, transformers or accelerate import (`test_no_trl_import.py`) | |
| `tests/trainers/` | the trainers: construction, validation, one loss and gradient step, the registry | |
| `tests/hub/` | the model card, and `push_to_hub` against a local Hub server (`test_push.py`: `slow`) | |
| `tests/e2e/` | full `trainer.train()` runs and launched processes: the CLI, the examples, the notebook | `slow` |
| `tests/distributed/` | `torchrun` launches of 2 CPU processes (gloo) | `distributed`, `slow` |
| `tests/vllm/` | a real vLLM engine (skipped where vLLM is not installed; CI's vLLM stage runs them) | `vllm`, `slow` |
| `tests/test_*.py` | the offline kit, the CLI's parsing and checks, the benchmarks' statistics, the docs | |

A few tests outside tests/e2e/ are marked `slow` where they are: the generic checks a toy method runs through
(`tests/trainers/test_registry.py`), the stand-in vLLM and LoRA runs (`tests/trainers/test_user_layer.py`), the
benchmark smokes (`tests/test_benchmarks.py`) and the objectives' import check in a fresh interpreter. The guard below
fails any test not marked `slow` that starts a process or calls `Trainer.train()`.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environment import set_offline_environment

set_offline_environment()

import torch  # noqa: E402  (after the environment: torch reads OMP_NUM_THREADS at import)

torch.set_num_threads(1)

TESTS = Path(__file__).resolve().parent

#: folder under tests/ -> the markers every test in it gets
FOLDER_MARKERS = {"e2e": ("slow",), "distributed": ("distributed", "slow"), "vllm": ("vllm", "slow")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        for marker in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(marker)


@pytest.fixture(scope="module")
def tokenizer():
    """The library's in-code tokenizer (one per test module)."""
    from tests.helpers import tiny_tokenizer  # imported here: the objectives' tests never load transformers

    return tiny_tokenizer()


@pytest.fixture(scope="module")
def base_model(tokenizer):
    """A random tiny Qwen2 for `tokenizer` (seed 5); tests clone it before training it."""
    from tests.helpers import tiny_model

    return tiny_model(tokenizer, seed=5)


@pytest.fixture
def nothing_loads(monkeypatch):
    """The refusal must come before the data door (and so before any model): reading the data or running the script
    fails the test."""
    from trl_groupopt.cli import script
    from trl_groupopt.data import adapters

    def reached(*args, **kwargs):
        raise AssertionError("the option passed the parser: the data was read (the model would load next)")

    monkeypatch.setattr(adapters, "load_datasets", reached)
    monkeypatch.setattr(script, "run", reached)


@pytest.fixture(autouse=True)
def _compare_jobs_in_this_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """In the fast selection, compare's local jobs (processes of submitit's LocalExecutor) run in threads of this
    process instead, where a test's stand-in for `trainrun.run_one` reaches them."""
    if request.node.get_closest_marker("slow") is None:
        from concurrent.futures import ThreadPoolExecutor

        from trl_groupopt.comparison import local  # standard library and submitit only: no torch, no TRL

        monkeypatch.setattr(local, "make_executor", lambda folder: ThreadPoolExecutor(8))
    yield


def _refuse(what: str, nodeid: str):
    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{nodeid} {what}, but it is not marked `slow`: the fast selection (-m 'not slow') runs in this process "
            "and trains nothing. Move it to tests/e2e/ (or tests/distributed/ for torchrun)."
        )

    return refuse


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test not marked `slow` may neither start a process (subprocess, multiprocessing, fork) nor call
    `Trainer.train()`, in its body or in any fixture it sets up (module-scoped ones included): it fails naming the
    folder to move it to."""
    if item.get_closest_marker("slow") is not None:
        return (yield)
    launch = _refuse("launched a process", item.nodeid)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", launch)
        mp.setattr(multiprocessing.process.BaseProcess, "start", launch)
        mp.setattr(os, "fork", launch)
        mp.setattr(os, "system", launch)
        trainer_module = sys.modules.get("transformers.trainer")  # imported by the test module, if it needs it
        if trainer_module is not None:
            mp.setattr(trainer_module.Trainer, "train", _refuse("ran Trainer.train()", item.nodeid))
        return (yield)
