"""The local launcher of `trl-groupopt compare`: the runs on this machine, on its free devices in parallel.

Every accelerator of the node (or those `--devices` lists) is a pool; a run takes `--gpus_per_run` devices from it when
they are free, runs pinned to them with `CUDA_VISIBLE_DEVICES` (`accelerate launch --num_processes N` for N > 1) and
gives them back, so as many runs go at once as there are device sets. Without devices runs train on the CPU,
`--workers` at once. Each record says which devices it had (docs/compare.md, "On a node with several GPUs")."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import runs as runfile
from . import trainrun
from .report import describe


def devices_here() -> list[str]:
    """The CUDA devices a run can be pinned to: the entries of this process's CUDA_VISIBLE_DEVICES where it is set,
    else every device torch counts; none without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


@dataclass(frozen=True)
class Placement:
    """Where the runs go: `devices` (empty: none), `per_run` devices each, `concurrency` runs at once, `on_cpu`: they
    train on the CPU (no devices, or a `--devices` list on a machine without CUDA: slots only)."""

    devices: tuple[str, ...]
    per_run: int
    concurrency: int
    on_cpu: bool


def place(devices: Sequence[str] | None, gpus_per_run: int, workers: int, use_cpu: bool) -> Placement | str:
    """The placement of the runs, or why it cannot be (one line naming the fix). `devices` None: this machine's
    (`devices_here`); on a machine without CUDA a `--devices` list is only a set of slots (the runs train on the CPU)."""
    here = [] if use_cpu else devices_here()
    pool = here if devices is None else list(devices)
    if len(set(pool)) != len(pool):
        return f"--devices {','.join(pool)} names a device twice: name each once."
    if here and (unknown := [d for d in pool if d not in here]):
        return f"--devices: {','.join(unknown)} not on this machine (its devices: {','.join(here)})."
    if not pool:
        if gpus_per_run > 1:
            return (f"--gpus_per_run {gpus_per_run}: no GPU here; drop it to train on the CPU (--workers K runs at "
                    "once), or list devices with --devices.")  # fmt: skip
        return Placement((), 1, workers, True)
    if gpus_per_run > len(pool):
        return (f"--gpus_per_run {gpus_per_run}: only {len(pool)} device(s) here ({','.join(pool)}); lower "
                "--gpus_per_run, or list more with --devices.")  # fmt: skip
    if workers > 1:
        return (f"--workers {workers} is the concurrency on the CPU: with devices ({','.join(pool)}) runs go to the "
                "free ones, one per device set; drop --workers (or add --use_cpu true to train on the CPU).")  # fmt: skip
    return Placement(tuple(pool), gpus_per_run, len(pool) // gpus_per_run, not here)


class DevicePool:
    """Free devices, taken `per_run` at a time and given back: no device is ever held by two runs at once."""

    def __init__(self, devices: Sequence[str], per_run: int) -> None:
        self.free, self.per_run = list(devices), per_run
        self.changed = threading.Condition()

    @contextmanager
    def hold(self) -> Iterator[list[str] | None]:
        """`per_run` free devices for the block (waits until there are); None when the pool is the CPU."""
        if not self.free and not self.per_run:
            yield None
            return
        with self.changed:
            self.changed.wait_for(lambda: len(self.free) >= self.per_run)
            taken, self.free = self.free[: self.per_run], self.free[self.per_run :]
        try:
            yield taken
        finally:
            with self.changed:
                self.free.extend(taken)
                self.changed.notify_all()


class LocalTrainer:
    """`run_one` of the grid: each (method, seed) on devices of the pool, its processes known so Ctrl-C stops them."""

    def __init__(self, spec: trainrun.RunSpec, placement: Placement, secrets: Mapping[str, str]) -> None:
        self.spec, self.secrets = spec, dict(secrets)
        self.pool = DevicePool(placement.devices, placement.per_run if placement.devices else 0)
        self.on_cpu = placement.on_cpu
        self.here = [] if placement.on_cpu else devices_here()
        self.live: set[subprocess.Popen] = set()
        self.lock, self.scoring = threading.Lock(), threading.Lock()
        self._before: float | None = None

    def _track(self, proc: subprocess.Popen | None, held: list) -> None:
        with self.lock:
            if proc is None:
                self.live.difference_update(held)
                held.clear()
            else:
                self.live.add(proc)
                held.append(proc)

    def _base_accuracy(self, device: str) -> float:
        with self.scoring:  # the starting model's, the same for every run: measured once, on the first run's device
            if self._before is None:
                self._before = trainrun.score(self.spec, self.spec.base_model(), device)
            return self._before

    def _device(self, devices: list[str] | None) -> str:
        """Where this process scores a run of `devices`: its first (by this process's CUDA index), or the CPU."""
        if not devices or self.on_cpu:
            return "cpu"
        return f"cuda:{self.here.index(devices[0])}"

    def __call__(self, method: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
        held: list[subprocess.Popen] = []
        with self.pool.hold() as devices:
            env, device = trainrun.run_env(self.spec, devices, self.secrets), self._device(devices)
            return trainrun.run_one(self.spec, method, seed, env, before=lambda: self._base_accuracy(device),
                                    track=lambda proc: self._track(proc, held), device=device)  # fmt: skip

    def kill(self) -> None:
        """Ctrl-C: the runs in flight are stopped (and lost)."""
        with self.lock:
            for proc in self.live:
                proc.kill()


def run_local(spec: trainrun.RunSpec, placement: Placement, secrets: Mapping[str, str], jobs: list[tuple],
              settings: dict[str, Any], command: str) -> None:  # fmt: skip
    """Run `jobs` ((method, seed)) here, each record appended to DIR/runs.jsonl as it finishes; a failed run or
    SIGTERM stops the grid after the runs in flight."""
    trainer = LocalTrainer(spec, placement, secrets)
    grid = runfile.Grid(("method", "seed"), trainer, describe)
    path = Path(spec.output_dir) / "runs.jsonl"
    try:
        runfile.run_grid(grid, jobs, settings, path, command, workers=placement.concurrency, pool="thread",
                         on_record=lambda record: "error" in record)  # fmt: skip
    except KeyboardInterrupt:
        trainer.kill()
        raise
