"""The grid runner of `benchmarks.stress` and `benchmarks.sample_efficiency`: a pool of worker processes, a keyed,
appendable JSONL file of per-run records, and where the runs came from (commands, workers, wall time).

A runs file holds two kinds of lines, appended as they happen:

- a run record per finished run (`Grid.run_one`'s result), identified by its key, the values of `Grid.key_fields`
  (stress: regime, value, config, seed; sample_efficiency: method, seed), and carrying the run settings it was made
  with (`settings`) and its own wall time (`wall_s`); a failed run's record has `error` instead of results;
- an invocation record, `{"invocation": {command, workers, runs, started, wall_s}}`, when an invocation that trained
  runs ends (also when it is interrupted by Ctrl-C or SIGTERM: the runs in flight are lost, no further one starts).

Running a grid again with the same runs file runs only the keys it lacks (a failed run is run again, and its new
record supersedes the failed one), so one grid can be split over several invocations; runs made with other settings
are refused, never mixed. The summary covers every run of the file, and its wall time is the sum over the
invocations. A runs file written before this format (no settings, no invocation records) is read as it is by
`--from-runs`; its provenance comes from the summary JSON written beside it at the time (`summary_beside`).
Everything heavy (torch, TRL) is imported by the workers, not here: `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import common

INVOCATION = "invocation"


@dataclass(frozen=True)
class Grid:
    """What the runner needs from a benchmark. `run_one(*key, settings)` trains one run and returns its record; it
    is sent to the worker processes, so it must be a module-level function. `describe(record)` is one line on a
    finished run for the progress log (in this process only)."""

    key_fields: tuple[str, ...]
    run_one: Callable[..., dict[str, Any]]
    describe: Callable[[dict[str, Any]], str]

    def key(self, record: dict[str, Any]) -> tuple:
        return tuple(record[name] for name in self.key_fields)

    def tag(self, record: dict[str, Any]) -> str:
        """`regime=long value=4 config=otb seed=1`: how the log and the errors name a run."""
        return " ".join(f"{name}={record[name]}" for name in self.key_fields)


@dataclass
class Runs:
    """A runs file as read: one record per key (the last written; in file order) and the invocation records."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[dict[str, Any]] = field(default_factory=list)


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every grid benchmark shares: parallel runs, CPU pinning, resuming, rebuilding."""
    parser.add_argument("--workers", type=int, default=1,
                        help="Parallel runs (processes, one torch thread each); 1 runs in this process.")  # fmt: skip
    parser.add_argument("--cpu-affinity", help="Pin this process and its workers to these CPUs, e.g. 0-1 (Linux).")
    parser.add_argument("--fresh", action="store_true",
                        help="Discard the runs file's records and run the whole grid again (by default the runs "
                        "it already holds are kept and skipped).")  # fmt: skip
    parser.add_argument("--from-runs", type=Path, help="Skip training: summarise and plot a runs JSONL file.")


# ------------------------------------------------------------------------------------------------ the runs file
def read_runs(path: Path, grid: Grid) -> Runs:
    """The records of a runs file (none if it does not exist): for each key the last record written, so a retried
    failure is superseded by its retry."""
    runs = Runs(path)
    latest: dict[tuple, dict[str, Any]] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        if not line.strip():
            continue
        entry = json.loads(line)
        if INVOCATION in entry:
            runs.invocations.append(entry[INVOCATION])
            continue
        latest.pop(grid.key(entry), None)  # a retry goes where it was written, after the runs before it
        latest[grid.key(entry)] = entry
    runs.records = list(latest.values())
    return runs


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line at the end of `path`, written at once (an interrupted grid keeps every finished run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(common.jsonable(entry)) + "\n")


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
    wanted = common.jsonable(settings)
    for record in runs.records:
        made = record.get("settings")
        if made is not None and made != wanted:
            differ = ", ".join(f"{k} {made.get(k)!r} there, {wanted.get(k)!r} here"
                               for k in sorted(set(made) | set(wanted)) if made.get(k) != wanted.get(k))  # fmt: skip
            fix = ", or --output-dir for a new runs file, or --fresh to discard its runs" if resuming else ""
            raise SystemExit(
                f"{runs.path}: the run {grid.tag(record)} was made with other settings ({differ}). Pass the flags "
                f"it was made with{fix}."
            )


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


def run_safely(run_one: Callable[..., dict[str, Any]], key_fields: Sequence[str], job: tuple,
               settings: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """`run_one(*job, settings)` with the settings recorded; a failure becomes a record with the traceback, so one
    failed run does not lose the others."""
    started = time.perf_counter()
    try:
        record = run_one(*job, settings)
    except Exception:  # noqa: BLE001 - reported in the record and the log
        record = {
            **dict(zip(key_fields, job)),
            "error": traceback.format_exc(),
            "wall_s": time.perf_counter() - started,
        }
    record["settings"] = settings
    return record


def _finished(grid: Grid, jobs: list[tuple], settings: dict[str, Any], workers: int) -> Iterator[dict[str, Any]]:
    """Each job's record as it finishes: in this process one after the other, or from a pool of spawned workers."""
    if workers <= 1:
        for job in jobs:
            yield run_safely(grid.run_one, grid.key_fields, job, settings)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=init_worker) as pool:
        futures = [pool.submit(run_safely, grid.run_one, grid.key_fields, job, settings) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:  # interrupted (see `_stop_on_sigterm`): start no further job
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM stops a grid as Ctrl-C does, so that its invocation record is written (a grid started in the
    background of a non-interactive shell ignores SIGINT, so SIGTERM is how it is stopped)."""
    raise KeyboardInterrupt(f"signal {signum}")


def run_grid(grid: Grid, jobs: list[tuple], settings: dict[str, Any], workers: int, path: Path, command: str) -> int:
    """Run `jobs` (keys), appending each record to `path` as it finishes and, at the end, this invocation's record;
    returns how many ran."""
    if not jobs:
        return 0
    started, started_at = time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    done = 0
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if main_thread else None
    try:
        for record in _finished(grid, jobs, settings, workers):
            done += 1
            append_line(path, record)
            head = f"  [{done}/{len(jobs)} {time.perf_counter() - started:5.0f} s] {grid.tag(record)}"
            if "error" in record:
                print(f"{head}: FAILED\n{record['error']}", flush=True)
            else:
                print(f"{head}: {grid.describe(record)}", flush=True)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if done:
            invocation = dict(command=command, workers=workers, runs=done, started=started_at,
                              wall_s=time.perf_counter() - started)  # fmt: skip
            append_line(path, {INVOCATION: invocation})
    return done


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
    done = {grid.key(r) for r in runs.records if "error" not in r}
    pending = [job for job in jobs if tuple(job) not in done]
    if len(pending) < len(jobs):
        print(f"  {len(jobs) - len(pending)} of the {len(jobs)} runs are in {runs_path} already: skipped", flush=True)
    run_grid(grid, pending, settings, args.workers, runs_path, command)
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
