"""The run's lock (`RunLock`): one live run per output folder (docs/reliability.md, "Runs that survive"). Standard
library only."""

from __future__ import annotations

import json
import os
import socket
import warnings
from pathlib import Path

from .checkpoints import read_json

LOCK_NAME = "_trl_groupopt.lock"


class OutputFolderInUseError(RuntimeError):
    """Another live run holds the output folder's lock."""


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        pass
    return True


class RunLock:
    """`with RunLock(output_dir):` the run's hold on `output_dir`, re-entrant within a process (the CLI holds it around
    the whole run, the trainer again around `train()`); `enabled=False` (not the main process) does nothing."""

    def __init__(self, output_dir: str | os.PathLike, *, enabled: bool = True):
        self.folder = Path(output_dir)
        self.path = self.folder / LOCK_NAME
        self.enabled = enabled
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self._held = False
        self._created_folder = False

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self.owner, handle)
        self._held = True
        return True

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        self._created_folder = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._try_create():
            return self
        holder = read_json(self.path) or {}  # being written, or cut short: held by an unknown process
        if holder == self.owner:
            return self  # this process already holds it (re-entered)
        pid, host = holder.get("pid"), holder.get("host")
        if isinstance(pid, int) and host == socket.gethostname() and not _process_exists(pid):
            warnings.warn(
                f"Taking over the lock of {self.folder}: it was left by process {pid}, which no longer exists (a "
                "run that was killed). Its checkpoints are kept.",
                stacklevel=2,
            )
            self.path.unlink(missing_ok=True)
            return self.__enter__()  # another run may take it first: then that run holds it
        who = f"process {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        raise OutputFolderInUseError(
            f"{self.folder} is in use by another run ({who}): two runs into one folder overwrite each other's files. "
            f"Choose another output_dir (--output_dir), wait for that run to end, or delete {self.path} if it is gone."
        )

    def __exit__(self, *exc_info) -> None:
        if not self._held:
            return
        if read_json(self.path) == self.owner:
            self.path.unlink(missing_ok=True)
        self._held = False
        if self._created_folder and self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()  # the run wrote nothing: leave no empty folder behind
