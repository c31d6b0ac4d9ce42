"""A run's output folder: which checkpoints are complete, which one to resume from, and the lock of the run using it.

Neither TRL nor torch is imported here (the CLI reads it before choosing a trainer).

**Complete checkpoints.** transformers writes a checkpoint file by file (weights, optimizer, scheduler, RNG states,
`trainer_state.json` last) with no completion mark, and `train(resume_from_checkpoint=True)` takes the
highest-numbered `checkpoint-*` folder, so a run killed while saving leaves a partial folder that every later resume
picks and crashes on. After a checkpoint is saved (on every process: a barrier), `GroupOptTrainer` writes
`CHECKPOINT_RECORD` into it: the size of every file in the folder. A checkpoint is complete when its record is there
and every file it lists has that size, which catches a save cut short at any point and a file truncated later (a
full disk, a copy between machines), in any layout (sharded or PEFT weights, FSDP or DeepSpeed shards, one RNG file
per process), because the record lists whatever the save wrote, not a list of expected names. We chose a record over
validating the files' formats for that reason: knowing every layout transformers, PEFT, FSDP and DeepSpeed write is
what the record avoids. Checkpoints without a record (written by `GRPOTrainer` or another `Trainer`) count as complete
when their `trainer_state.json`, which transformers writes last, is there and parses.

**The lock.** `RunLock` holds `LOCK_NAME` (the pid and host) in the folder while a run writes to it: a second run into
the same folder refuses with an error instead of silently replacing the first's checkpoints and model. It is released
on exit; a lock left by a process that no longer exists (killed) is taken over with a warning. The name starts with
`_`, which transformers leaves out of every Hub upload.
"""

from __future__ import annotations

import json
import os
import re
import socket
import warnings
from pathlib import Path

__all__ = [
    "CHECKPOINT_RECORD",
    "LOCK_NAME",
    "OutputFolderInUseError",
    "RunLock",
    "checkpoint_problem",
    "checkpoints",
    "newest_complete_checkpoint",
    "resolve_resume",
    "write_checkpoint_record",
]

#: Written into a checkpoint folder after everything else: {"files": {relative path: size in bytes}}.
CHECKPOINT_RECORD = "trl_groupopt_checkpoint.json"
#: The run lock in the output folder.
LOCK_NAME = "_trl_groupopt.lock"
#: transformers' checkpoint folder names (`PREFIX_CHECKPOINT_DIR`-<step>).
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_TRAINER_STATE = "trainer_state.json"


# ---------------------------------------------------------------------------------------------------- checkpoints
def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of `output_dir`, newest (highest step) first; [] if there is no folder."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, key=lambda item: item[0], reverse=True)]


def _files(folder: Path) -> dict[str, int]:
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != CHECKPOINT_RECORD
    }


def write_checkpoint_record(folder: str | os.PathLike) -> None:
    """Record every file of the (fully written) checkpoint `folder` with its size; atomic (temporary file, rename)."""
    folder = Path(folder)
    temporary = folder / f".{CHECKPOINT_RECORD}.tmp"
    temporary.write_text(json.dumps({"files": _files(folder)}, indent=1), encoding="utf-8")
    os.replace(temporary, folder / CHECKPOINT_RECORD)


def remove_checkpoint_record(folder: str | os.PathLike) -> None:
    """Drop the record of `folder` before it is saved again: a save cut short must not pass for the earlier one."""
    Path(folder, CHECKPOINT_RECORD).unlink(missing_ok=True)


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """What makes `folder` an incomplete checkpoint (e.g. "model.safetensors is 3,145,728 bytes, 8,519,224
    recorded"), or None if it is complete (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        return "it is not a folder"
    record = folder / CHECKPOINT_RECORD
    if not record.is_file():
        state = folder / _TRAINER_STATE
        if not state.is_file():
            return f"no {CHECKPOINT_RECORD} and no {_TRAINER_STATE} (the save was cut short)"
        try:
            json.loads(state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return f"no {CHECKPOINT_RECORD}, and {_TRAINER_STATE} is cut short"
        return None
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKPOINT_RECORD} is unreadable"
    missing = [name for name in recorded if not (folder / name).is_file()]
    if missing:
        return f"missing {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    for name, size in recorded.items():
        actual = (folder / name).stat().st_size
        if actual != size:
            return f"{name} is {actual:,} bytes, {size:,} recorded (truncated)"
    return None


def newest_complete_checkpoint(output_dir: str | os.PathLike, *, warn: bool = True) -> str | None:
    """The newest complete checkpoint in `output_dir` (a path), or None; each newer incomplete one is skipped with a
    warning that names it and what is missing."""
    for folder in checkpoints(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder)
        if warn:
            warnings.warn(
                f"Skipping the incomplete checkpoint {folder}: {problem}. Resuming from an earlier one; this folder "
                "is overwritten when training reaches its step again.",
                UserWarning,
                stacklevel=2,
            )
    return None


def resolve_resume(output_dir: str | os.PathLike, resume_from_checkpoint: str | bool | None) -> str | None:
    """The checkpoint path `train(resume_from_checkpoint=...)` should load.

    True or "last": the newest complete checkpoint of `output_dir` (incomplete newer ones are skipped with a warning);
    a path: that checkpoint, if complete; None/False: None. Raises `ValueError` naming the folder and the fix.
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True or resume_from_checkpoint == "last":
        found = newest_complete_checkpoint(output_dir)
        if found is None:
            what = "incomplete checkpoints only" if checkpoints(output_dir) else "no checkpoint"
            raise ValueError(
                f"Cannot resume: {output_dir} holds {what}. Start a fresh run (without resume_from_checkpoint / "
                "--resume_from_checkpoint), or name a checkpoint folder."
            )
        return found
    problem = checkpoint_problem(resume_from_checkpoint)
    if problem is not None:
        parent = Path(resume_from_checkpoint).parent
        raise ValueError(
            f"Cannot resume from {resume_from_checkpoint}: {problem}. Resume from the newest complete checkpoint "
            f"instead (resume_from_checkpoint=True, or --resume_from_checkpoint last with --output_dir {parent})."
        )
    return str(resume_from_checkpoint)


# ---------------------------------------------------------------------------------------------------- the lock
class OutputFolderInUseError(RuntimeError):
    """Another live run holds the output folder's lock."""


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class RunLock:
    """`with RunLock(output_dir):` the run's hold on `output_dir` (see the module docstring).

    Re-entrant within a process (the CLI holds it around the whole run, the trainer again around `train()`).
    `enabled=False` (processes other than the main one) does nothing. On release, a folder the lock created and that
    is still empty (the run failed before writing anything) is removed.
    """

    def __init__(self, output_dir: str | os.PathLike, *, enabled: bool = True):
        self.folder = Path(output_dir)
        self.path = self.folder / LOCK_NAME
        self.enabled = enabled
        self._held = False
        self._created_folder = False

    def _owner(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self._owner(), handle)
        return True

    def _holder(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # being written, or cut short: treated as held by an unknown process

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        self._created_folder = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._try_create():
            self._held = True
            return self
        holder = self._holder()
        if holder == self._owner():
            return self  # this process already holds it (re-entered)
        pid, host = holder.get("pid"), holder.get("host")
        if isinstance(pid, int) and host == socket.gethostname() and not _process_exists(pid):
            warnings.warn(
                f"Taking over the lock of {self.folder}: it was left by process {pid}, which no longer exists (a "
                "run that was killed). Its checkpoints are kept.",
                UserWarning,
                stacklevel=2,
            )
            self.path.unlink(missing_ok=True)
            if self._try_create():
                self._held = True
                return self
            holder = self._holder()
        who = f"process {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        raise OutputFolderInUseError(
            f"{self.folder} is in use by another run ({who}): two runs into one folder overwrite each other's "
            f"checkpoints and model. Choose another output_dir (--output_dir), or wait for that run to end. If no "
            f"such run exists, delete {self.path}."
        )

    def __exit__(self, *exc_info) -> None:
        if not self._held:
            return
        if self._holder() == self._owner():
            self.path.unlink(missing_ok=True)
        self._held = False
        if self._created_folder and self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()  # the run wrote nothing: leave no empty folder behind
