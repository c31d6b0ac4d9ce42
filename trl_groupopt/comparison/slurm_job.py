"""What a Slurm job of `trl-groupopt compare` runs on its node: one (method, seed) through `trainrun.run_one`, its
record written to DIR/slurm/results/<job id>.json (atomically: a result file is whole or absent).

submitit pickles `run_job` (a reference to this module) and its arguments (a `RunSpec`, the key, the settings: plain
data, never a secret) into DIR/slurm/jobs. A job stopped by Slurm (scancel, preemption: SIGTERM) writes no result:
the driver learns its end from `squeue` (slurm.py). A run that fails, or a time limit submitit reports, writes an
error record, so the driver reports it at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from . import trainrun
from .runs import failure

RESULTS = "results"


def results_folder(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "slurm" / RESULTS


def this_job_id() -> str:
    """The job's id as `sbatch` and submitit name it: `ARRAY_TASK` for a task of an array, else the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "unknown")


def write_result(output_dir: str | os.PathLike, job_id: str, record: dict[str, Any]) -> Path:
    """The record as DIR/slurm/results/<job id>.json, renamed into place once written."""
    from .runs import jsonable

    folder = results_folder(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job_id}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(jsonable(record)) + "\n")
    os.replace(partial, path)
    return path


class _Stopped:
    """SIGTERM from Slurm (scancel, preemption, the time limit's last warning): noted, and passed to the run."""

    def __init__(self) -> None:
        self.signalled = False
        self.proc: subprocess.Popen | None = None
        self.previous = signal.signal(signal.SIGTERM, self)

    def __call__(self, signum: int, frame: Any) -> None:
        self.signalled = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()

    def track(self, proc: subprocess.Popen | None) -> None:
        self.proc = proc

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)


def run_job(spec: trainrun.RunSpec, method: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Train (method, seed) on this node and write its record; returns it (submitit pickles it too)."""
    job_id, started = this_job_id(), time.perf_counter()
    extra = {}
    if "OMP_NUM_THREADS" not in os.environ and os.environ.get("SLURM_CPUS_PER_TASK"):
        extra["OMP_NUM_THREADS"] = os.environ["SLURM_CPUS_PER_TASK"]  # torch would use every core of the node
    stopped = _Stopped()
    try:
        record = trainrun.run_one(spec, method, seed, trainrun.run_env(spec, None, extra), track=stopped.track)
    except Exception as error:  # noqa: BLE001 - a failed run, or submitit's time-limit error: reported in the record
        if stopped.signalled:
            raise  # cancelled or preempted: no result; squeue tells the driver
        record = {"method": method, "seed": seed, **failure(error), "wall_s": time.perf_counter() - started}
    finally:
        stopped.restore()
    if stopped.signalled:
        raise RuntimeError(f"job {job_id} got SIGTERM (cancelled, preempted or at its time limit): no result written")
    record.update(settings=settings, slurm_job_id=job_id, log=str(spec.folder(method, seed).with_suffix(".log")))
    write_result(spec.output_dir, job_id, record)
    return record
