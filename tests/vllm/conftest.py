"""Fixtures for the real-vLLM tests: the engine shims, applied once per test process (see engine.py)."""

import os
import sys

import pytest

from .engine import REQUIRE_VLLM_ENV, apply_shims, vllm_installed


def pytest_configure(config):
    if os.environ.get(REQUIRE_VLLM_ENV) and not vllm_installed():
        raise pytest.UsageError(
            f"{REQUIRE_VLLM_ENV} is set but vLLM is not installed in {sys.prefix}: run the tests with the "
            "environment that `bash scripts/vllm_cpu_env.sh` builds (or install the CUDA vllm wheel on a GPU)."
        )


@pytest.fixture(scope="session")
def vllm_shims():
    """The CPU/GPU engine shims (engine.apply_shims), for the whole session: engines are shared across tests."""
    with pytest.MonkeyPatch.context() as mp:
        apply_shims(mp)
        yield
