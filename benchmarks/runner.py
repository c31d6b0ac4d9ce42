"""The benchmarks' side of the runner (`trl_groupopt.runs`, the runner of `trl-groupopt compare` too): the grid
options, the config every run starts from, worker set-up, and where a summary's runs came from.

`benchmarks.stress` and `benchmarks.sample_efficiency` key their runs (stress: regime, value, config, seed;
sample_efficiency: method, seed) in an appendable JSONL file: running a grid again runs only the keys the file lacks,
runs made with other settings are refused, and SIGTERM stops after the runs in flight (see `trl_groupopt.runs`). A
runs file written before runs were keyed (no settings, no invocation records) is read as it is by `--from-runs`; its
provenance comes from the summary JSON written beside it at the time (`summary_beside`). Everything heavy (torch,
TRL) is imported by the workers, not here: `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl_groupopt.runs import INVOCATION, Grid, Runs, append_line, pending, read_runs, settings_conflict
from trl_groupopt.runs import run_grid as _run_grid

from . import common

__all__ = ["INVOCATION", "Grid", "Runs", "append_line", "read_runs"]


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every grid benchmark shares: parallel runs, CPU pinning, resuming, rebuilding."""
    parser.add_argument("--workers", type=int, default=1,
                        help="Parallel runs (processes, one torch thread each); 1 runs in this process.")  # fmt: skip
    parser.add_argument("--cpu-affinity", help="Pin this process and its workers to these CPUs, e.g. 0-1 (Linux).")
    parser.add_argument("--fresh", action="store_true",
                        help="Discard the runs file's records and run the whole grid again (by default the runs "
                        "it already holds are kept and skipped).")  # fmt: skip
    parser.add_argument("--from-runs", type=Path, help="Skip training: summarise and plot a runs JSONL file.")


def check_settings(grid: Grid, runs: Runs, settings: dict[str, Any], resuming: bool) -> None:
    """Refuse to mix runs made with other settings (budget, task size, device) with these: a summary would pool
    them. When `resuming`, also refuse records without settings (written before runs files were keyed)."""
    unknown = sum("settings" not in r for r in runs.records)
    if resuming and unknown:
        raise SystemExit(
            f"{runs.path} holds {unknown} run(s) written without their settings (before runs files were keyed), so "
            "they cannot be checked against these flags: pass --fresh to run the grid again from the start, or "
            "--output-dir for a new runs file (--from-runs still rebuilds the summary from this one)."
        )
    conflict = settings_conflict(grid, runs, settings)
    if conflict:
        fix = ", or --output-dir for a new runs file, or --fresh to discard its runs" if resuming else ""
        raise SystemExit(f"{conflict}. Pass the flags it was made with{fix}.")


# ------------------------------------------------------------------------------------------------ running
def start(args: argparse.Namespace) -> str:
    """Pin the CPUs (`--cpu-affinity`), set the offline environment and resolve `--device` (on the CPU: one torch
    thread in this process too); returns the device."""
    common.set_cpu_affinity(args.cpu_affinity)
    common.setup_environment()
    return common.resolve_device(args.device)


def demo_config(settings: dict[str, Any], seed: int, output_dir: str) -> dict[str, Any]:
    """The config kwargs every run of a grid starts from: the demo's (`trl_groupopt.cli.DEMO_DEFAULTS`) with the
    run's budget, seed and device, a log entry per optimizer step (the curves), fp32 weights and no data-loader
    workers. The benchmark then sets its regime's knobs."""
    from trl_groupopt.cli import DEMO_DEFAULTS

    kwargs = dict(DEMO_DEFAULTS)
    kwargs.update(
        output_dir=output_dir,
        max_steps=settings["max_steps"],
        logging_steps=1,
        seed=seed,
        use_cpu=settings["device"] == "cpu",
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
    )
    return kwargs


def init_worker() -> None:
    """A worker process: one torch thread (set before torch is imported in this fresh, spawned process)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    common.setup_environment()
    import torch

    torch.set_num_threads(1)


def run_grid(grid: Grid, jobs: list[tuple], settings: dict[str, Any], workers: int, path: Path, command: str) -> int:
    """Run `jobs` (keys) `workers` at a time in spawned processes (`init_worker`), each record appended to `path` as
    it finishes; returns how many ran (`trl_groupopt.runs.run_grid`)."""
    return _run_grid(grid, jobs, settings, path, command, workers=workers, initializer=init_worker)


def collect(grid: Grid, args: argparse.Namespace, jobs: list[tuple], settings: dict[str, Any], runs_path: Path,
            command: str) -> Runs:  # fmt: skip
    """The runs to summarise: with `--from-runs` that file as it is; else `runs_path` after running the jobs whose
    keys it lacks (all of them with `--fresh`)."""
    if args.from_runs:
        runs = read_runs(args.from_runs, grid)
        check_settings(grid, runs, settings, resuming=False)
        return runs
    if args.fresh and runs_path.exists():
        runs_path.unlink()
    runs = read_runs(runs_path, grid)
    check_settings(grid, runs, settings, resuming=True)
    todo = pending(grid, runs, jobs)
    if len(todo) < len(jobs):
        print(f"  {len(jobs) - len(todo)} of the {len(jobs)} runs are in {runs_path} already: skipped", flush=True)
    run_grid(grid, todo, settings, args.workers, runs_path, command)
    return read_runs(runs_path, grid)


# ------------------------------------------------------------------------------------------------ summaries
def summary_beside(runs_path: Path) -> Path:
    """The summary JSON written with a runs file: `stress_runs.jsonl` -> `stress.json`."""
    return runs_path.with_name(runs_path.name.removesuffix(".jsonl").removesuffix("_runs") + ".json")


def provenance(runs: Runs, command: str, workers: int) -> dict[str, Any]:
    """What made the runs: `command` (the invocations' commands, in order), `workers`, and `wall_s`, the total wall
    time of the invocations that trained them; `invocations` lists them. A runs file without invocation records
    takes these from the summary JSON written beside it (`summary_beside`), else from this command and the sum of
    the runs' own wall times (as if run one after the other)."""
    if runs.invocations:
        return {
            "command": " ; ".join(dict.fromkeys(i["command"] for i in runs.invocations)),
            "workers": max(i["workers"] for i in runs.invocations),
            "wall_s": sum(i["wall_s"] for i in runs.invocations),
            "invocations": runs.invocations,
        }
    beside = summary_beside(runs.path)
    if beside.exists():
        old = json.loads(beside.read_text())
        return {"command": old["command"], "workers": old["settings"]["workers"], "wall_s": old["wall_s"]}
    return {"command": command, "workers": workers, "wall_s": sum(r.get("wall_s") or 0.0 for r in runs.records)}


def recorded_device(runs: Runs, device: str) -> dict[str, Any]:
    """The machine the runs were made on (the first record's), else this one's description."""
    return next((r["device_info"] for r in runs.records if "device_info" in r), None) or common.describe_device(device)


def failed_runs(grid: Grid, runs: Runs) -> list[dict[str, Any]]:
    """The failed runs' keys with the end of their tracebacks."""
    return [
        dict(zip(grid.key_fields, grid.key(r))) | {"error": r["error"][-2000:]} for r in runs.records if "error" in r
    ]


def close_payload(payload: dict[str, Any], made: dict[str, Any]) -> dict[str, Any]:
    """A summary's last fields, from `provenance`: the total wall time and, where recorded, the invocations."""
    payload["wall_s"] = made["wall_s"]
    if "invocations" in made:
        payload["invocations"] = made["invocations"]
    return payload


def print_end(payload: dict[str, Any], runs: Runs, written: Sequence[Path | None]) -> None:
    """The last lines of a grid benchmark: failed runs, the files written, the runs and their total wall time."""
    if payload["failed_runs"]:
        print(f"{len(payload['failed_runs'])} run(s) failed: see failed_runs in the JSON")
    print(f"wrote {', '.join(str(p) for p in written if p)}; {len(runs.records)} run(s), "
          f"{payload['wall_s'] / 60:.1f} min of wall time in all", flush=True)  # fmt: skip
