"""The train process of one run, inside its job (`trainrun.run_one`): started in a session of its own, its output in
the run's log, its failure said in one line; stopped with its job.

A job owns its train process: whatever stops the job (its driver gone, SIGTERM from the driver, `scancel` or a time
limit) stops the train process first (`stop_tree`, through psutil). Nothing is written for a later invocation to
signal: a re-run waits for the run's folder lock (`trainrun.run_one`), which the kernel drops with the job."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: seconds a train process has to stop on SIGTERM before it is killed
STOP_GRACE_S = 10.0
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
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
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


def launch(command: list[str], log: Path, env: Mapping[str, str],
           track: Callable[[subprocess.Popen | None], None] | None = None) -> tuple[float, float]:  # fmt: skip
    """Run `command` with its output in `log`; (wall, CPU seconds). `track(proc)` is told the process while it runs,
    then None. Raises RunFailed naming the log on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)  # fmt: skip
        if track is not None:
            track(proc)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        finally:
            if proc.returncode is None:  # interrupted: the run must not outlive its job
                stop_tree(proc.pid, grace=0.0)
                proc.wait()
            if track is not None:
                track(None)
    if proc.returncode:
        code = proc.returncode
        status = f"killed by signal {-code} ({signal.strsignal(-code)})" if code < 0 else f"exit status {code}"
        raise RunFailed(f"{status}; {log}: {failure_reason(log)}")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime
