"""Launch a worker script on N CPU processes (gloo) from pytest and collect each rank's JSON result.

`accelerate launch --cpu --num_processes 2` silently runs ONE process, so we use torchrun, which
accelerate's `PartialState` picks up (RANK / WORLD_SIZE / MASTER_ADDR) and, with `use_cpu=True`, runs on gloo.
A worker receives `--out DIR` and must write `DIR/rank{RANK}.json`; it should assert the world size it expects.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from tests.environment import REPO_ROOT, process_environment

WORKERS = Path(__file__).resolve().parent / "workers"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(worker: str | Path, nproc: int, out_dir: Path, *args: str, timeout: int = 900) -> list[dict]:
    """Run `worker` on `nproc` processes; return the list of per-rank results (rank order)."""
    worker = Path(worker)
    if not worker.is_absolute():
        worker = WORKERS / worker
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = process_environment(MASTER_ADDR="127.0.0.1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--nnodes", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(worker), "--out", str(out_dir), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(nproc)]


def write_result(out_dir: str | Path, result: dict) -> NoReturn:
    """Called by workers, last: write this rank's result, wait for every rank, and end the process at once.

    The barrier keeps a rank from leaving while another still runs a collective. Then `os._exit`: no Python or C++
    teardown runs. Teardown deadlocked or aborted after the work was done: freeing DDP's reducer (GIL held) destroys
    the last ProcessGroupGloo, whose destructor joins gloo's worker thread while that thread waits for the GIL to free
    a finished all-gather's tensor (a hang until the launch timeout; py-spy showed both stacks), and a gloo thread
    left joinable at interpreter exit aborts the process ("terminate called without an active exception", SIGABRT).
    """
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch_worlds(worker: str, root: Path, *args: str, timeout: int = 900) -> dict[int, tuple[list[dict], list]]:
    """Run `worker` on 1 and on 2 processes at once; {world size: (per-rank JSON results, per-rank tensors)}. The
    worker writes its tensors to `rank{RANK}_tensors.pt` besides its JSON result."""
    import torch

    def run(world_size: int):
        out = Path(root) / f"world{world_size}"
        results = launch(worker, world_size, out, "--world-size", str(world_size), *args, timeout=timeout)
        return results, [torch.load(out / f"rank{rank}_tensors.pt") for rank in range(world_size)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((1, 2), pool.map(run, (1, 2))))


def case_of(runs: dict, world_size: int, name: str, rank: int = 0) -> tuple[dict, dict]:
    """One case's (JSON result, tensors) on one rank of a `launch_worlds` run."""
    results, tensors = runs[world_size]
    return results[rank]["cases"][name], tensors[rank][name]
