"""What a Slurm job of `trl-groupopt compare` runs on its node: one (method, seed) through `trainrun.run_one`, its
record written to DIR/slurm/results/<job id>.json (atomically: a result file is whole or absent).

submitit pickles `run_job` (a reference to this module) and its arguments (a `RunSpec`, the key, the settings: plain
data, never a secret) into DIR/slurm/jobs. A job stopped by Slurm (scancel, preemption: SIGTERM) writes no result:
the driver learns its end from `squeue` (slurm.py). A run that fails, or a time limit submitit reports, writes an
error record, so the driver reports it at once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from . import trainrun
from .process import job_guard
from .runs import failure, jsonable, write_json

RESULTS = "results"


def results_folder(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "slurm" / RESULTS


def this_job_id() -> str:
    """The job's id as `sbatch` and submitit name it: `ARRAY_TASK` for a task of an array, else the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "unknown")


def write_result(output_dir: str | os.PathLike, job_id: str, record: dict[str, Any]) -> Path:
    """The record as DIR/slurm/results/<job id>.json, renamed into place once written."""
    folder = results_folder(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job_id}.json"
    write_json(path, jsonable(record))
    return path


def run_job(spec: trainrun.RunSpec, method: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Train (method, seed) on this node and write its record; returns it (submitit pickles it too)."""
    job_id, started = this_job_id(), time.perf_counter()
    extra = {}
    if "OMP_NUM_THREADS" not in os.environ and os.environ.get("SLURM_CPUS_PER_TASK"):
        extra["OMP_NUM_THREADS"] = os.environ["SLURM_CPUS_PER_TASK"]  # torch would use every core of the node
    with job_guard():  # scancel, preemption, the time limit: SystemExit, the run stopped, no result written
        try:
            record = trainrun.run_one(spec, method, seed, trainrun.run_env(spec, None, extra))
        except Exception as error:  # noqa: BLE001 - a failed run, or submitit's time-limit error: in the record
            record = {"method": method, "seed": seed, **failure(error), "wall_s": time.perf_counter() - started}
    record.update(settings=settings, slurm_job_id=job_id, log=str(spec.folder(method, seed).with_suffix(".log")))
    write_result(spec.output_dir, job_id, record)
    return record
