"""The run's lock (`RunLock`): one live run per output folder (docs/reliability.md, "Runs that survive"). Standard
library only. The hold is the kernel's (`flock` on the lock file, kept open for the run's life): taking it is atomic,
and the kernel drops it when the process ends, however it ends, so a dead run's lock is never raced for."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import warnings
from pathlib import Path

from .checkpoints import read_json

try:
    import fcntl

    def _try_lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while another process holds it
except ImportError:  # Windows
    import msvcrt

    def _try_lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # PermissionError while another process holds it


LOCK_NAME = "_trl_groupopt.lock"


class OutputFolderInUseError(RuntimeError):
    """Another live run holds the output folder's lock."""


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


class RunLock:
    """`with RunLock(output_dir):` the run's hold on `output_dir`, taken once per run (`trl_groupopt.runfolder.run`);
    a second hold, even in the same process, is refused. `enabled=False` (not the main process) does nothing. On
    release the lock file goes, and so does the folder if the lock created it and it is empty (nothing else: a
    folder with anything in it stays)."""

    def __init__(self, output_dir: str | os.PathLike, *, enabled: bool = True):
        self.folder = Path(output_dir)
        self.path = self.folder / LOCK_NAME
        self.enabled = enabled
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self._fd: int | None = None
        self._created_folder = False

    def _locked_fd(self) -> int:
        """An open descriptor of the lock file at `path`, locked by this process; raises if another holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _try_lock(fd)
            except OSError:
                os.close(fd)
                holder = read_json(self.path)  # None: just taken, its owner not yet written
                who = f"process {holder.get('pid')} on {holder.get('host')}" if isinstance(holder, dict) else ""
                raise OutputFolderInUseError(
                    f"{self.folder} is in use by another run ({who or 'another process'}): two runs into one folder "
                    "overwrite each other's files. Choose another output_dir (--output_dir) or wait for that run to "
                    "end (its lock ends with it)."
                ) from None
            if _same_file(fd, self.path):
                return fd
            os.close(fd)  # the holder released it (removing the file) between our open and lock: take the new one

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        with contextlib.suppress(FileExistsError):
            self.folder.mkdir(parents=True)
            self._created_folder = True
        try:
            fd = self._locked_fd()
        except BaseException:
            self._remove_created_folder()
            raise
        left = read_json(self.path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.owner).encode(), 0)
        self._fd = fd
        if isinstance(left, dict) and left.get("pid") is not None:
            warnings.warn(
                f"The lock of {self.folder} was left by process {left.get('pid')} on {left.get('host')}, which ended "
                "without releasing it (killed?); the kernel had dropped its hold, so this run holds the folder now. "
                "Its checkpoints are kept.",
                stacklevel=2,
            )
        return self

    def __exit__(self, *exc_info) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # removed while held: no one can take the old file after us
            self.path.unlink()
        os.close(self._fd)
        self._fd = None
        self._remove_created_folder()

    def _remove_created_folder(self) -> None:
        if self._created_folder:  # the run wrote nothing: leave no empty folder behind (rmdir fails on any other)
            with contextlib.suppress(OSError):
                self.folder.rmdir()
