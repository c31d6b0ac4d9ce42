"""A run's process: started in a session of its own (SIGTERM to the driver's terminal group leaves it running), but
never outliving the driver, and a failure said in one line (standard library only).

- On Linux the run dies with the driver, whatever stopped the driver (SIGKILL too): the run's first act, before it
  execs the train command, is `prctl(PR_SET_PDEATHSIG, SIGTERM)` (`GUARD`).
- Everywhere, the run's process is written to DIR/runs/M-S.pid while it runs: a re-run that finds the file with
  that process still alive (a driver killed hard elsewhere, or a run still shutting down) stops its session first
  (`stop_orphan`), so the run is never trained twice into one folder.
- `failure_reason`: the line of the run's log that says why it failed: the error, not the progress bar; a full disk
  named as such."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: run in the child before the train command: die with the driver (1: PR_SET_PDEATHSIG), or now if it is gone
GUARD = ("import ctypes, os, signal, sys\n"
         "ctypes.CDLL(None).prctl(1, ctypes.c_ulong(signal.SIGTERM), 0, 0, 0)\n"
         "os.getppid() == int(sys.argv[1]) or sys.exit(143)\n"
         "os.execvp(sys.argv[2], sys.argv[2:])")  # fmt: skip
#: seconds an orphaned run has to stop on SIGTERM before it is killed
ORPHAN_GRACE_S = 30.0
_PROGRESS = re.compile(r"\d+%\|.*\||\d+it \[|\b\d+(\.\d+)?(it/s|s/it)\]")  # tqdm's bars
_ERROR = re.compile(r"^([\w.]*(Error|Exception)\b|KeyboardInterrupt|Killed)|\berror:")
_FULL = ("No space left on device", "ENOSPC", "[Errno 28]")


class RunFailed(RuntimeError):
    """A run's process exited with an error: one line, its log named."""


def guarded(command: list[str]) -> list[str]:
    """`command` run under `GUARD` (Linux; elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-S", "-c", GUARD, str(os.getpid()), *command]


def _started(pid: int) -> str | None:
    """When process `pid` started (Linux: /proc's clock ticks since boot; None elsewhere or when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a process that has not ended (Linux: a zombie has; elsewhere: any)."""
    if Path("/proc/self/stat").exists():
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue  # ended while read
            if int(group) == pgid and state != "Z":
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _wait_group(pgid: int, seconds: float) -> bool:
    """Wait up to `seconds` for process group `pgid` to end; whether it did."""
    deadline = time.monotonic() + seconds
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _group_alive(pgid)


def stop_orphan(pid_file: Path, say: Callable[[str], None] = print) -> None:
    """If `pid_file` names a run's session still alive on this host (its driver was killed hard), stop it: SIGTERM,
    then SIGKILL after `ORPHAN_GRACE_S`; then remove the file."""
    try:
        entry = json.loads(pid_file.read_text())
        pid, host, started = int(entry["pid"]), entry["host"], entry.get("started")
    except (OSError, ValueError, TypeError, KeyError):
        pid_file.unlink(missing_ok=True)
        return
    if host != socket.gethostname():
        return  # another node's: not ours to stop (that node's kernel ended it with its driver)
    # the session leader is the one started then (a pid is never reused while its session has a process)
    ours = _group_alive(pid) and (started is None or _started(pid) in (started, None))
    if ours:
        say(f"{pid_file.with_suffix('')}: its run (process {pid}) outlived a comparison killed hard: stopping it")
        for sig, wait in ((signal.SIGTERM, ORPHAN_GRACE_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            if _wait_group(pid, wait):
                break
    pid_file.unlink(missing_ok=True)


def failure_reason(log: Path) -> str:
    """Why the run of `log` failed, in one line: the last error line (an exception, an `error:` line), else the last
    line that is not a progress bar; a full disk said so."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip() and not _PROGRESS.search(line)]
    if any(mark in line for line in lines[-40:] for mark in _FULL):
        return f"the disk is full (No space left on device): free space under {log.parent} and run it again"
    errors = [line for line in lines if _ERROR.search(line)]
    return ((errors or lines)[-1:] or ["no output"])[0][-300:]


def launch(command: list[str], log: Path, env: Mapping[str, str],
           track: Callable[[subprocess.Popen | None], None] | None = None) -> tuple[float, float]:  # fmt: skip
    """Run `command` with its output in `log`; (wall, CPU seconds). `track(proc)` is told the process while it runs,
    then None. Raises RunFailed naming the log on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file, started = log.with_suffix(".pid"), time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(guarded(command), stdout=handle, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)  # fmt: skip
        pid_file.write_text(json.dumps({"pid": proc.pid, "host": socket.gethostname(), "started": _started(proc.pid)}))
        if track is not None:
            track(proc)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        finally:
            if proc.returncode is None:  # interrupted (a job's timeout): the run must not outlive its caller
                proc.kill()
                proc.wait()
            pid_file.unlink(missing_ok=True)
            if track is not None:
                track(None)
    if proc.returncode:
        code = proc.returncode
        status = f"killed by signal {-code} ({signal.strsignal(-code)})" if code < 0 else f"exit status {code}"
        raise RunFailed(f"{status}; {log}: {failure_reason(log)}")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime
