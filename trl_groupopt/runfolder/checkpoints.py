"""A run folder's checkpoints: which are complete (`CHECKPOINT_RECORD`), and which one to resume from:
docs/reliability.md, "Runs that survive". Imports neither TRL nor torch (the CLI reads it first)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

#: Written into a checkpoint folder after everything else: {"files": {relative path: {"size": bytes, "sha256": hex}},
#: "run": {...}} ("run": what `trl_groupopt.runfolder.resume` checks on resume; older records: {"files": {path: size}}).
CHECKPOINT_RECORD = "trl_groupopt_checkpoint.json"
#: transformers' checkpoint folder names (`PREFIX_CHECKPOINT_DIR`-<step>).
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
#: What a checkpoint holds and a run's final output folder does not (transformers' optimizer, scheduler, RNG state).
_TRAINING_STATE_FILES = ("optimizer*", "scheduler*", "rng_state*", "global_step*")
NOT_A_CHECKPOINT = "it is not a checkpoint (no optimizer, scheduler or RNG state: a run's final output folder?)"


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of `output_dir`, newest (highest step) first; [] if there is no folder."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, key=lambda item: item[0], reverse=True)]


def file_digest(path: str | os.PathLike, *, sync: bool = False) -> str:
    """The SHA-256 hex digest of the file at `path`; `sync`: fsync it first (its bytes are on the disk)."""
    digest = hashlib.sha256()
    with open(path, "r+b" if sync else "rb") as handle:  # a read-only handle cannot be fsynced on Windows
        if sync:
            os.fsync(handle.fileno())
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without folder handles (Windows): the rename is what it offers
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint_record(folder: str | os.PathLike, run: dict | None = None) -> None:
    """Record every file of the saved checkpoint `folder` (size, SHA-256) and `run` (what the resume rules read)."""
    folder = Path(folder)
    paths = [p for p in sorted(folder.rglob("*")) if p.is_file() and CHECKPOINT_RECORD not in p.name]  # and its .tmp
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_digest(p, sync=True)} for p in paths
    }
    for sub in {p.parent for p in paths} - {folder}:
        _fsync_folder(sub)
    temporary = folder / f".{CHECKPOINT_RECORD}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"files": files, "run": run or {}}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, folder / CHECKPOINT_RECORD)
    _fsync_folder(folder)


def remove_checkpoint_record(folder: str | os.PathLike) -> None:
    """Drop the record of `folder` before it is saved again: a save cut short must not pass for the earlier one."""
    Path(folder, CHECKPOINT_RECORD).unlink(missing_ok=True)


def read_json(path: str | os.PathLike) -> Any:
    """The parsed JSON file at `path`, or None if it is missing or does not parse."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_checkpoint_record(folder: str | os.PathLike) -> dict | None:
    """The parsed record of `folder`, or None if it has none or it does not parse."""
    record = read_json(Path(folder, CHECKPOINT_RECORD))
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


#: (folder, record's mtime, each file's (size, mtime)) of checkpoints verified in this process: a resume checks the
#: same folder from the CLI and again in `train()`, and digesting a large checkpoint twice would double its cost.
_VERIFIED: set[tuple] = set()


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """What makes `folder` an incomplete or damaged checkpoint ("x.pt is 40 bytes, 128 recorded"), or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return "it is not a folder"
    if not (folder / CHECKPOINT_RECORD).is_file():
        if not _CHECKPOINT.match(folder.name) and not any(any(folder.glob(g)) for g in _TRAINING_STATE_FILES):
            return NOT_A_CHECKPOINT
        if read_json(folder / TRAINER_STATE) is not None:
            return None
        if not (folder / TRAINER_STATE).is_file():
            return f"no {CHECKPOINT_RECORD} and no {TRAINER_STATE} (the save was cut short)"
        return f"no {CHECKPOINT_RECORD}, and {TRAINER_STATE} is cut short"
    record = read_checkpoint_record(folder)
    if record is None:
        return f"{CHECKPOINT_RECORD} is unreadable"
    recorded = record["files"]
    missing = [name for name in recorded if not (folder / name).is_file()]
    if missing:
        return f"missing {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    entries = {name: entry if isinstance(entry, dict) else {"size": entry} for name, entry in recorded.items()}
    for name, entry in entries.items():
        actual = (folder / name).stat().st_size
        if actual != entry.get("size"):
            return f"{name} is {actual:,} bytes, {entry.get('size'):,} recorded (truncated)"
    stamp = (str(folder.resolve()), (folder / CHECKPOINT_RECORD).stat().st_mtime_ns,
             tuple((name, (folder / name).stat().st_mtime_ns) for name in sorted(entries)))  # fmt: skip
    if stamp in _VERIFIED:
        return None
    for name, entry in entries.items():
        if "sha256" in entry and file_digest(folder / name) != entry["sha256"]:
            return (
                f"{name} has the recorded size but not the recorded content (SHA-256 differs: its bytes changed "
                "after the save, e.g. a power loss or a copy cut short)"
            )
    _VERIFIED.add(stamp)
    return None


def newest_complete_checkpoint(output_dir: str | os.PathLike, *, warn: bool = True) -> str | None:
    """The newest complete checkpoint in `output_dir`, or None; newer incomplete ones are skipped with a warning."""
    for folder in checkpoints(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder)
        if warn:
            warnings.warn(
                f"Skipping the incomplete or damaged checkpoint {folder}: {problem}. Resuming from an earlier one; "
                "this folder is overwritten when training reaches its step again.",
                stacklevel=2,
            )
    return None


def resolve_resume(output_dir: str | os.PathLike, resume_from_checkpoint: str | bool | None) -> str | None:
    """The checkpoint `train(resume_from_checkpoint=...)` loads: True or "last": the newest complete one of
    `output_dir`; a path: that checkpoint, if complete; None/False: None. Raises `ValueError` naming the fix."""
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
    if problem == NOT_A_CHECKPOINT:
        raise ValueError(
            f"Cannot resume from {resume_from_checkpoint}: {problem}. Resume one of its checkpoints "
            f"(--resume_from_checkpoint last --output_dir {resume_from_checkpoint}) or start anew from its weights"
            f" (--model_name_or_path {resume_from_checkpoint}, model_name_or_path in Python) and another --output_dir."
        )
    if problem is not None:
        parent = Path(resume_from_checkpoint).parent
        raise ValueError(
            f"Cannot resume from {resume_from_checkpoint}: {problem}. Resume from the newest complete checkpoint "
            f"instead (resume_from_checkpoint=True, or --resume_from_checkpoint last with --output_dir {parent})."
        )
    return str(resume_from_checkpoint)
