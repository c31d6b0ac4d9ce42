"""The train process of one run, inside its job (`trainrun.run_one`): its output in the run's log, its failure said
in one line; stopped with its job. It stays in its job's process group, so a signal to the group (a terminal's, a
SIGKILL to the driver's group) reaches it as it reaches the job.

A job owns its train process: whatever stops the job (its driver gone, SIGTERM from the driver, `scancel` or a time
limit) stops the train process first (`stop_tree`, through psutil). Nothing is written for a later invocation to
signal: a re-run waits for the run's folder lock (`trainrun.run_one`), which the kernel drops with the job."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

#: seconds a train process has to stop on SIGTERM before it is killed
STOP_GRACE_S = 10.0
#: seconds between a job's looks at its driver
WATCH_S = 0.5
_PROGRESS = re.compile(r"\d+%\|.*\||\d+it \[|\b\d+(\.\d+)?(it/s|s/it)\]")  # tqdm's bars
_ERROR = re.compile(r"^([\w.]*(Error|Exception)\b|KeyboardInterrupt|Killed)|\berror:")
_FULL = ("No space left on device", "ENOSPC", "[Errno 28]")


class RunFailed(RuntimeError):
    """A run's process exited with an error: one line, its log named."""


def stop_tree(pid: int, grace: float = STOP_GRACE_S) -> None:
    """Stop process `pid` and every process under it: SIGTERM, then SIGKILL after `grace` seconds."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with suppress(psutil.NoSuchProcess):  # it ended meanwhile
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5.0)


def failure_reason(log: Path) -> str:
    """Why the run of `log` failed, in one line: the first line of the last error (an exception, an `error:` line),
    whole, else the last line that is not a progress bar; a full disk said so."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip() and not _PROGRESS.search(line)]
    if any(mark in line for line in lines[-40:] for mark in _FULL):
        return f"the disk is full (No space left on device): free space under {log.parent} and run it again"
    errors = [line for line in lines if _ERROR.search(line)]
    return ((errors or lines)[-1:] or ["no output"])[0]


def launch(command: list[str], log: Path, env: Mapping[str, str]) -> tuple[float, float]:
    """Run `command` with its output in `log`; (wall, CPU seconds). Raises RunFailed naming the log on a non-zero
    exit; stops it (and what it started) when the caller is interrupted (`job_guard`'s SystemExit, Ctrl-C)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=dict(env))
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        finally:
            if proc.returncode is None:  # interrupted: the run must not outlive its job
                stop_tree(proc.pid, grace=0.0)
                proc.wait()
    if proc.returncode:
        code = proc.returncode
        status = f"killed by signal {-code} ({signal.strsignal(-code)})" if code < 0 else f"exit status {code}"
        raise RunFailed(f"{status}; {log}: {failure_reason(log)}")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def alive(pid: int, created: float) -> bool:
    """Whether process `pid`, started at `created` (psutil's create_time), still runs: a pid reused since is not."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def this_process() -> tuple[int, float]:
    """(pid, start time) of this process: how a local job knows its driver."""
    import psutil

    return os.getpid(), psutil.Process().create_time()


@contextmanager
def job_guard(driver: tuple[int, float] | None = None) -> Iterator[None]:
    """A job's block: SIGTERM (the driver's stop, `scancel`, a time limit, a group's signal) ends it with SystemExit,
    its run stopped on the way out (`launch`); with `driver` (pid, start time), a watcher ends it the same way when the
    driver is gone (SIGKILL, a crash). In the main thread only; the handler is restored after."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum)) if main else None
    ended = threading.Event()

    def watch(pid: int, created: float) -> None:
        while not ended.wait(WATCH_S):
            if not alive(pid, created):
                os.kill(os.getpid(), signal.SIGTERM)
                return

    if driver is not None and main:
        threading.Thread(target=watch, args=driver, daemon=True).start()
    try:
        yield
    finally:
        ended.set()
        if main:
            signal.signal(signal.SIGTERM, previous)
