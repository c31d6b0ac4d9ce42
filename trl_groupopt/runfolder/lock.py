"""The run's lock (`RunLock`): one live run per output folder (docs/reliability.md, "Runs that survive"). Standard
library only. The hold is the kernel's (`flock` on the output folder itself and on the lock file, both kept open for
the run's life): taking it is atomic, the kernel drops it when the process ends, however it ends, so a dead run's
lock is never raced for, and deleting a live run's lock file does not free its folder. The lock file only says who
holds it; it is opened without following links and only ever written when this lock created it, so a link, FIFO or
foreign file planted under its name is refused, never written through."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import warnings
from pathlib import Path

try:
    import fcntl

    def _try_lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while another process holds it
except ImportError:  # Windows
    import msvcrt

    def _try_lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # PermissionError while another process holds it


LOCK_NAME = "_trl_groupopt.lock"
#: never follow a link at the lock's name; never wait on a FIFO planted there (the flags are 0 where absent)
_NO_LINK = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_HELD = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)  # flock / msvcrt: another process holds it


class OutputFolderInUseError(RuntimeError):
    """Another live run holds the output folder's lock."""


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _read_owner(fd: int) -> dict | None | str:
    """The lock record in the open lock file: {"pid", "host"}; None: empty; "foreign": anything else."""
    text = os.pread(fd, 4096, 0)
    if not text:
        return None
    try:
        owner = json.loads(text.decode("utf-8"))
    except ValueError:
        return "foreign"
    return owner if isinstance(owner, dict) and set(owner) == {"pid", "host"} else "foreign"


def pid_is_running(pid: object) -> bool:
    """Whether a process with id `pid` runs on this host (False for anything that is not a positive int)."""
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by another user
        return True
    return True


def _left_by(left: dict, folder: Path) -> str:
    """The warning for a lock file whose owner no longer holds it, saying truthfully what is known of the owner."""
    pid, host = left.get("pid"), left.get("host")
    if host != socket.gethostname():
        fate = "which does not hold it (from this host, whether it still runs cannot be seen)"
    elif pid_is_running(pid):
        fate = "which does not hold it, though a process with that pid runs now (the pid reused by another process)"
    else:
        fate = "which ended without releasing it (killed?)"
    return (
        f"The lock of {folder} was left by process {pid} on {host}, {fate}; the kernel had dropped its hold, so this "
        "run holds the folder now. Its checkpoints are kept."
    )


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
        self._folder_fd: int | None = None
        self._created_folder = False

    def _in_use(self, holder: object) -> OutputFolderInUseError:
        who = f"process {holder.get('pid')} on {holder.get('host')}" if isinstance(holder, dict) else ""
        return OutputFolderInUseError(
            f"{self.folder} is in use by another run ({who or 'another process'}): two runs into one folder "
            "overwrite each other's files. Choose another output_dir (--output_dir) or wait for that run to "
            "end (its lock ends with it)."
        )

    def _refuse(self, what: str) -> ValueError:
        return ValueError(
            f"{self.path} is {what}, not a lock file this library wrote: it is never opened through or written. "
            f"Remove it (rm {self.path}) if nothing of yours is there, then run again."
        )

    def _hold_folder(self) -> None:
        """Hold the folder itself: a second run is refused even when a live run's lock file was deleted."""
        try:
            fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:  # a platform without folder handles (Windows): the lock file is the hold
            return
        try:
            _try_lock(fd)
        except OSError as error:
            os.close(fd)
            if error.errno in _HELD:
                raise self._in_use(self._holder()) from None
            return  # a file system without folder locks (NFS): the lock file is the hold
        self._folder_fd = fd

    def _holder(self) -> dict | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | _NO_LINK)
        except OSError:
            return None
        try:
            owner = _read_owner(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
            return owner if isinstance(owner, dict) else None
        finally:
            os.close(fd)

    def _open(self) -> tuple[int, bool]:
        """(an open descriptor of the regular lock file at `path`, whether this call created it)."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NO_LINK, 0o644), True
        except FileExistsError:
            pass
        try:
            fd = os.open(self.path, os.O_RDWR | _NO_LINK)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(self.path):
                raise self._refuse("a symbolic link") from None
            if error.errno == errno.EISDIR:
                raise self._refuse("a folder") from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise self._refuse("a FIFO" if stat.S_ISFIFO(mode) else "not a regular file")
        return fd, False

    def _locked_fd(self) -> tuple[int, dict | None]:
        """(an open descriptor of a lock file this call created at `path`, locked by this process; the record of
        the lock file a dead run left there, if any). Raises if another process holds it."""
        left = None
        while True:
            fd, created = self._open()
            try:
                _try_lock(fd)
            except OSError:
                holder = _read_owner(fd)  # None: just taken, its owner not yet written
                os.close(fd)
                raise self._in_use(holder) from None
            if not _same_file(fd, self.path):
                os.close(fd)  # the holder released it (removing the file) between our open and lock: try again
                continue
            if created:
                return fd, left
            owner = _read_owner(fd)  # left by a run that ended: replaced by a file of our own, never rewritten
            if owner == "foreign" or os.fstat(fd).st_nlink != 1:
                os.close(fd)
                raise self._refuse("a file with other content" if owner == "foreign" else "a hard link")
            left = owner
            self.path.unlink()
            os.close(fd)

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        with contextlib.suppress(FileExistsError):
            self.folder.mkdir(parents=True)
            self._created_folder = True
        try:
            self._hold_folder()
            fd, left = self._locked_fd()
            self._fd = fd
            self._write_owner(fd)
        except BaseException:
            self.__exit__()
            raise
        if isinstance(left, dict):
            warnings.warn(_left_by(left, self.folder), stacklevel=2)
        return self

    def _write_owner(self, fd: int) -> None:
        try:
            os.pwrite(fd, json.dumps(self.owner).encode(), 0)
        except OSError as error:  # a full disk: say which file
            raise OSError(error.errno, f"{error.strerror}: cannot write the run's lock {self.path}") from None

    def __exit__(self, *exc_info) -> None:
        if self._fd is not None:
            if _same_file(self._fd, self.path):  # removed or replaced while held: not ours to remove
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(self._fd)
            self._fd = None
        if self._folder_fd is not None:
            os.close(self._folder_fd)
            self._folder_fd = None
        self._remove_created_folder()

    def _remove_created_folder(self) -> None:
        if self._created_folder:  # the run wrote nothing: leave no empty folder behind (rmdir fails on any other)
            with contextlib.suppress(OSError):
                self.folder.rmdir()
