"""The runs files of `trl-groupopt compare` and of the benchmarks' grids (a keyed, appendable JSONL file), and the
benchmarks' grid runner (a pool of worker processes, a progress line per run). Standard library only. See
benchmarks/README.md (the grid runner), docs/compare.md."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

INVOCATION = "invocation"


@dataclass(frozen=True)
class Grid:
    """What the runner needs from a grid. `run_one(*key, settings)` makes one run and returns its record (for a
    process pool: a module-level function); `describe(record)` is one line on a finished run for the progress log."""

    key_fields: tuple[str, ...]
    run_one: Callable[..., dict[str, Any]]
    describe: Callable[[dict[str, Any]], str]
    check: Callable[[dict[str, Any]], str | None] | None = None  # why a record is not usable (None: it is)

    def key(self, record: dict[str, Any]) -> tuple:
        return tuple(record[name] for name in self.key_fields)

    def tag(self, record: dict[str, Any]) -> str:
        """`method=<name> seed=1`: how the log and the errors name a run."""
        return " ".join(f"{name}={record[name]}" for name in self.key_fields)


@dataclass
class Runs:
    """A runs file as read: one record per key (the last written; in file order) and the invocation records."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the damaged lines, one warning each


def jsonable(value: Any) -> Any:
    """NaN/inf -> None (strict JSON), tuples -> lists, 0-dim tensors and numpy scalars -> Python numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def read_lines(path: Path) -> tuple[list[tuple[int, Any]], list[str]]:
    """(line number, value) of each line of a JSON-lines file (none if it does not exist), and a warning for each
    line that is not JSON: the last one cut short by a stop while it was written, or damaged. The file is left as
    it is (`append_line` starts a new line after a cut one)."""
    text = Path(path).read_bytes().decode(errors="replace") if Path(path).exists() else ""
    lines, problems = text.split("\n"), []
    cut = lines[-1] != ""  # a whole last line ends with its newline
    values = []
    for number, line in enumerate(lines[:-1] + ([lines[-1]] if cut else []), start=1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except ValueError:
            how = "is cut short (a stop while it was written)" if cut and number == len(lines) else "is not JSON"
            problems.append(f"{path} line {number} {how}: skipped (the file keeps it)")
    return values, problems


def _problem(grid: Grid, entry: Any) -> str | None:
    """Why a line's value is not a record of `grid` or an invocation record, or None."""
    if not isinstance(entry, dict):
        return f"is {type(entry).__name__}, not a record"
    if INVOCATION in entry:
        ok = isinstance(entry[INVOCATION], dict) and isinstance(entry[INVOCATION].get("wall_s"), (int, float))
        return None if ok else "is not an invocation record"
    if missing := [f for f in grid.key_fields if not isinstance(entry.get(f), (str, int, float))]:
        return f"has no {', '.join(missing)}"
    return grid.check(entry) if grid.check is not None else None


def read_runs(path: Path, grid: Grid) -> Runs:
    """The records of a runs file (none if it does not exist): for each key the last record written. A damaged
    line is skipped, with a warning in `skipped`: the good records are all kept, and a run whose record is damaged
    counts as not run."""
    runs = Runs(Path(path))
    latest: dict[tuple, dict[str, Any]] = {}
    values, runs.skipped = read_lines(runs.path)  # written by `append_line`
    for number, entry in values:
        if (problem := _problem(grid, entry)) is not None:
            runs.skipped.append(f"{runs.path} line {number} {problem}: skipped (the file keeps it)")
        elif INVOCATION in entry:
            runs.invocations.append(entry[INVOCATION])
        else:
            latest.pop(grid.key(entry), None)  # a retry goes where it was written, after the runs before it
            latest[grid.key(entry)] = entry
    runs.records = list(latest.values())
    return runs


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line at the end of `path`, written at once (a stopped grid keeps every finished run), on a line of
    its own after a last line cut short."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as handle:  # appends wherever it reads
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - 1))
        cut = size > 0 and handle.read(1) != b"\n"
        handle.write((("\n" if cut else "") + json.dumps(jsonable(entry)) + "\n").encode())


def write_json(path: Path, value: Any) -> None:
    """`value` as one JSON line in `path`, whole or absent: written beside it (`<name>.partial`), renamed into place."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(json.dumps(value) + "\n")
    os.replace(partial, path)


def reason(record: dict[str, Any]) -> str:
    """Why a failed run failed, in one line: its `reason`, else the last line of its `error`."""
    lines = [line.strip() for line in str(record.get("error")).splitlines() if line.strip()]
    return str(record.get("reason") or (lines or ["?"])[-1])


def settings_conflict(grid: Grid, runs: Runs, settings: dict[str, Any]) -> str | None:
    """Why these settings cannot join `runs` (a summary would pool them): the first run made with others, or None."""
    wanted = jsonable(settings)
    for record in runs.records:
        made = record.get("settings")
        if made is not None and made != wanted:
            differ = ", ".join(f"{k} {made.get(k)!r} there, {wanted.get(k)!r} here"
                               for k in sorted(set(made) | set(wanted)) if made.get(k) != wanted.get(k))  # fmt: skip
            return f"{runs.path}: the run {grid.tag(record)} was made with other settings ({differ})"
    return None


def run_safely(run_one: Callable[..., dict[str, Any]], key_fields: Sequence[str], job: tuple,
               settings: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """`run_one(*job, settings)` with the settings recorded; a failure becomes a record with the traceback (`error`)
    and its one line (`reason`)."""
    started = time.perf_counter()
    try:
        record = run_one(*job, settings)
    except Exception as error:  # noqa: BLE001 - reported in the record and the log
        record = {**dict(zip(key_fields, job)), **failure(error), "wall_s": time.perf_counter() - started}
    record["settings"] = settings
    return record


def failure(error: BaseException) -> dict[str, str]:
    """A failed run's `error` (the traceback) and `reason` (one line), while `error` is being handled."""
    return {"error": traceback.format_exc(), "reason": f"{type(error).__name__}: {' '.join(str(error).split())}"}


def _worker_start() -> None:
    """A pool worker ignores SIGTERM: its parent stops the grid after the runs in flight."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _finished(grid: Grid, jobs: list[tuple], settings: dict[str, Any], pool: Executor | None,
              workers: int, stop: threading.Event) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Each job's record as it finishes, in this process one after the other or `workers` at a time in `pool`."""
    if pool is None:  # the condition is read before each job: a stop starts no further one
        yield from (run_safely(grid.run_one, grid.key_fields, job, settings) for job in jobs if not stop.is_set())
        return
    queue, running = list(jobs), set()  # Ctrl-C: `run_grid` shuts the pool down, starting nothing more
    while running or (queue and not stop.is_set()):
        while queue and len(running) < workers and not stop.is_set():
            running.add(pool.submit(run_safely, grid.run_one, grid.key_fields, queue.pop(0), settings))
        done, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
        for future in done:
            yield future.result()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def progress_line(done: int, total: int, elapsed: float, width: int = 20) -> str:
    """`[3/8 #######-------------  1:02 elapsed, ~1:43 left]`: the time left at the pace so far."""
    filled = round(width * done / total) if total else width
    left = f", ~{_clock(elapsed / done * (total - done))} left" if 0 < done < total else ""
    return f"[{done}/{total} {'#' * filled}{'-' * (width - filled)} {_clock(elapsed)} elapsed{left}]"


def now() -> tuple[float, str]:
    """(perf_counter, UTC time to the second): when an invocation began, for its progress lines and its record."""
    return time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")


def append_invocation(path: Path, began: tuple[float, str], **fields: Any) -> None:
    """An invocation's record at the end of `path`: `fields`, then when it began (`now`) and its wall seconds."""
    append_line(path, {INVOCATION: {**fields, "started": began[1], "wall_s": time.perf_counter() - began[0]}})


@contextmanager
def stop_on_signals(stop: threading.Event, then: str, signals: Sequence[int] = (signal.SIGTERM,),
                    say: Callable[[str], Any] | None = None) -> Iterator[None]:  # fmt: skip
    """In the block, each of `signals` sets `stop` and says `signal N: <then>` (on stderr, or through `say`); in
    the main thread only (elsewhere nothing is changed), the handlers restored after."""

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        if say is None:
            print(f"signal {signum}: {then}", file=sys.stderr, flush=True)
        else:
            say(f"signal {signum}: {then}")

    main = threading.current_thread() is threading.main_thread()
    previous = [signal.signal(s, on_signal) for s in signals] if main else []
    try:
        yield
    finally:
        for sig, handler in zip(signals, previous):
            signal.signal(sig, handler)


def run_grid(grid: Grid, jobs: list[tuple], settings: dict[str, Any], path: Path, command: str, *, workers: int = 1,
             on_record: Callable[[dict[str, Any]], bool] | None = None) -> int:  # fmt: skip
    """Run `jobs` (keys), appending each record to `path` as it finishes and, at the end, this invocation's record;
    returns how many ran. `workers` > 1 runs that many at once in a pool of processes. `on_record(record)` returning
    True stops the grid as SIGTERM does."""
    began, done = now(), 0
    executor: Executor | None = None
    if workers > 1:
        spawn = multiprocessing.get_context("spawn")
        executor = ProcessPoolExecutor(max_workers=workers, mp_context=spawn, initializer=_worker_start)
    stop = threading.Event()  # SIGTERM (heard in the main thread only): no further run starts; those in flight finish
    try:
        with stop_on_signals(stop, "stopping after the run(s) in flight"):
            for record in _finished(grid, jobs, settings, executor, workers, stop):
                done += 1
                append_line(path, record)
                head = f"  {progress_line(done, len(jobs), time.perf_counter() - began[0])} {grid.tag(record)}"
                tail = f"FAILED: {reason(record)}" if "error" in record else grid.describe(record)
                print(f"{head}: {tail}", flush=True)
                if on_record is not None and on_record(record):
                    stop.set()
    finally:
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if done:
            append_invocation(path, began, command=command, workers=workers, runs=done)
    return done


def pending(grid: Grid, runs: Runs, jobs: Sequence[tuple]) -> list[tuple]:
    """The jobs whose keys have no finished run in `runs`."""
    done = {grid.key(r) for r in runs.records if "error" not in r}
    return [tuple(job) for job in jobs if tuple(job) not in done]
