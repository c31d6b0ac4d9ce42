"""The local launcher of `trl-groupopt compare`: each run a job of submitit's `LocalExecutor` (a process of its own,
training and scoring alike), as many at once as there are device sets, each pinned to its set.

Every accelerator of the node (or those `--devices` lists) is split into sets of `--gpus_per_run`; a job gets a free
set, pins itself to it with `CUDA_VISIBLE_DEVICES` (`accelerate launch --num_processes N` for N > 1) and gives it back
when it ends. Without devices runs train on the CPU, `--workers` at once. A job never outlives its driver: it stops
its run when the driver is gone, however the driver ended (`process.job_guard`). Each record says which devices it had
(docs/compare.md, "On a node with several GPUs")."""

from __future__ import annotations

import functools
import os
import shlex
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import runs as runfile
from . import trainrun
from .argv import secrets_in_environment
from .process import job_guard, this_process
from .report import describe

#: a local job's time limit (submitit's LocalExecutor stops a job at its limit): none in practice
NO_LIMIT_MIN = 60 * 24 * 365
#: seconds between the driver's looks at its jobs
POLL_S = 0.5


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


def run_job(spec: trainrun.RunSpec, method: str, seed: int, settings: dict[str, Any], devices: list[str] | None,
            on_cpu: bool, driver: tuple[int, float] | None) -> dict[str, Any]:  # fmt: skip
    """A local job: train and score (method, seed) in this process, pinned to `devices`; its record (a failed run's
    with its reason). It ends when its driver (pid, start time) has (`process.job_guard`)."""
    device = "cpu"
    if devices and not on_cpu:  # this process scores on them: pinned before anything starts CUDA here
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        device = "cuda:0"
    env = trainrun.run_env(spec, devices, {})

    def one(method: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
        return trainrun.run_one(spec, method, seed, env, device=device)

    with job_guard(driver):
        return runfile.run_safely(one, ("method", "seed"), (method, seed), settings)


def make_executor(folder: Path) -> Any:
    """submitit's LocalExecutor for the jobs of DIR: its controllers' own output in DIR/local/controller.log, deaf
    to Ctrl-C (the driver decides: its jobs end with it), no time limit."""
    import submitit

    executor = submitit.LocalExecutor(folder=str(folder))
    log = shlex.quote(str(folder / "controller.log"))
    executor.update_parameters(timeout_min=NO_LIMIT_MIN, setup=[f"exec >>{log} 2>&1 </dev/null", "trap '' INT"])
    return executor


def device_sets(placement: Placement) -> list[list[str] | None]:
    """The device sets runs are pinned to, one per run at once (None: no devices, the CPU)."""
    if not placement.devices:
        return [None] * placement.concurrency
    per = placement.per_run
    return [list(placement.devices[i * per : (i + 1) * per]) for i in range(placement.concurrency)]


def _ended(job: Any, key: tuple, settings: dict[str, Any]) -> dict[str, Any]:
    """The record of a job that has ended: its run's, or a failed run's when the job ended without one."""
    try:
        return job.result()
    except Exception as error:  # noqa: BLE001 - the job's process died (killed, out of memory): reported
        lines = [line for line in str(error).splitlines() if line.strip()]
        log = getattr(getattr(job, "paths", None), "stderr", None)
        reason = f"its job ended without a result ({(lines or [type(error).__name__])[0]}); its log: {log}"
        return {"method": key[0], "seed": key[1], "error": str(error), "reason": reason, "wall_s": None,
                "settings": settings}  # fmt: skip


def run_local(spec: trainrun.RunSpec, placement: Placement, secrets: Mapping[str, str], jobs: list[tuple],
              settings: dict[str, Any], command: str) -> None:  # fmt: skip
    """Run `jobs` ((method, seed)) as local jobs, each record appended to DIR/runs.jsonl as it ends; a failed run
    or SIGTERM stops the grid after the runs in flight. Ctrl-C (or any end of this process) ends the jobs too."""
    from tqdm.auto import tqdm

    executor = make_executor(Path(spec.output_dir) / "local" / "jobs")
    path, grid = Path(spec.output_dir) / "runs.jsonl", runfile.Grid(("method", "seed"), None, describe)
    free, queue, running, stop = device_sets(placement), list(jobs), {}, threading.Event()
    began, driver, done = runfile.now(), this_process(), 0
    bar = tqdm(total=len(jobs), unit="run", desc="compare", file=sys.stdout, disable=None)  # a terminal's only
    say = functools.partial(tqdm.write, file=sys.stderr)
    try:
        # a job's process copies this environment (never a pickle)
        with (
            runfile.stop_on_signals(stop, "stopping after the run(s) in flight", say=say),
            secrets_in_environment(secrets),
        ):
            while queue and not stop.is_set() or running:
                while queue and free and not stop.is_set():
                    key, devices = queue.pop(0), free.pop(0)
                    job = executor.submit(run_job, spec, *key, settings, devices, placement.on_cpu, driver)
                    running[job] = (key, devices)
                for job in [j for j in running if j.done()]:
                    key, devices = running.pop(job)
                    free.append(devices)
                    record, done = _ended(job, key, settings), done + 1
                    count = runfile.progress_line(done, len(jobs), time.perf_counter() - began[0])
                    append_line_and_say(path, grid, record, bar, count)
                    if "error" in record:  # a failed run stops the grid (it runs again next time)
                        stop.set()
                time.sleep(POLL_S if running else 0)
    finally:
        bar.close()
        if done:
            runfile.append_invocation(path, began, command=command, workers=placement.concurrency, runs=done)


def append_line_and_say(path: Path, grid: runfile.Grid, record: dict[str, Any], bar: Any, count: str) -> None:
    """A run's record into DIR/runs.jsonl, and its line (`count`: where the grid is, for a log) above the progress
    bar (tqdm's, on a terminal)."""
    runfile.append_line(path, record)
    bar.update(1)
    tail = f"FAILED: {runfile.reason(record)}" if "error" in record else describe(record)
    bar.write(f"  {count} {grid.tag(record)}: {tail}", file=sys.stdout)
