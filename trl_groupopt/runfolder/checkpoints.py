"""A run folder's records: which checkpoints are complete (`CHECKPOINT_RECORD`), whether the final outputs are
(`FINAL_RECORD`), and which checkpoint to resume from: docs/reliability.md, "Runs that survive". Imports neither TRL
nor torch (the CLI reads it first). `python -m trl_groupopt.runfolder.checkpoints DIR` records a checkpoint that
another Trainer wrote (whose files cannot be verified otherwise), vouching for its files as they are once they load
(`vouch_problem`) and no live run holds its output folder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

#: Written into a checkpoint folder after everything else: {"files": {relative path: {"size": bytes, "sha256": hex}},
#: "run": {...}} ("run": what `trl_groupopt.runfolder.resume` checks on resume; older records: {"files": {path: int}}).
CHECKPOINT_RECORD = "trl_groupopt_checkpoint.json"
#: The same record of a run's final outputs (the top-level files of its output folder), written by the command line
#: after the model, card, state and results.json: {"files": ..., "run": {"step": the step they are of}}.
FINAL_RECORD = "trl_groupopt_final.json"
#: transformers' checkpoint folder names (`PREFIX_CHECKPOINT_DIR`-<step>).
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
#: What a checkpoint holds and a run's final output folder does not (transformers' optimizer, scheduler, RNG state).
_TRAINING_STATE_FILES = ("optimizer*", "scheduler*", "rng_state*", "global_step*")
NOT_A_CHECKPOINT = "it is not a checkpoint (no optimizer, scheduler or RNG state: a run's final output folder?)"
NO_RECORD = (
    f"no {CHECKPOINT_RECORD}: its save was cut short (our trainers write it last, after every file), or another "
    "Trainer wrote it, and nothing vouches for its files"
)


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


def _write_record(folder: Path, name: str, paths: list[Path], run: dict | None) -> None:
    """Record `paths` (size, SHA-256 of their fsynced bytes) and `run` as `folder/name`, atomically and durably."""
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_digest(p, sync=True)} for p in paths
    }
    for sub in {p.parent for p in paths} - {folder}:
        _fsync_folder(sub)
    temporary = folder / f".{name}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"files": files, "run": run or {}}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, folder / name)
    _fsync_folder(folder)


def write_checkpoint_record(folder: str | os.PathLike, run: dict | None = None) -> None:
    """Record every file of the saved checkpoint `folder` (size, SHA-256) and `run` (what the resume rules read)."""
    folder = Path(folder)
    paths = [p for p in sorted(folder.rglob("*")) if p.is_file() and CHECKPOINT_RECORD not in p.name]  # and its .tmp
    _write_record(folder, CHECKPOINT_RECORD, paths, run)


def write_final_record(output_dir: str | os.PathLike, step: int) -> None:
    """Record the final outputs of a run at `step`: the top-level files of `output_dir` but its lock and records."""
    folder = Path(output_dir)
    paths = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(("_", "."))
             and p.name not in (FINAL_RECORD, CHECKPOINT_RECORD)]  # fmt: skip
    _write_record(folder, FINAL_RECORD, paths, {"step": step})


def remove_record(folder: str | os.PathLike, name: str = CHECKPOINT_RECORD) -> None:
    """Drop the record of `folder` before it is saved again: a save cut short must not pass for the earlier one."""
    try:
        Path(folder, name).unlink()
    except FileNotFoundError:
        return
    _fsync_folder(Path(folder))  # the removal reaches the disk before any rewritten byte can


def read_json(path: str | os.PathLike) -> Any:
    """The parsed JSON file at `path`, or None if it is missing or does not parse."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_checkpoint_record(folder: str | os.PathLike, name: str = CHECKPOINT_RECORD) -> dict | None:
    """The parsed record of `folder`, or None if it has none or it does not parse."""
    record = read_json(Path(folder, name))
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


#: (folder, record's mtime, each file's (size, mtime)) of records verified in this process: digesting a large
#: checkpoint twice (e.g. a resume that is refused and asked again) would double its cost.
_VERIFIED: set[tuple] = set()


def _recorded_entries(recorded: dict, name: str, required: str | None) -> dict[str, dict] | str:
    """{file: {"size": int, "sha256": hex (absent in records of sizes only)}}, or what makes the record unusable."""
    entries = {}
    for file, entry in recorded.items():
        entry = entry if isinstance(entry, dict) else {"size": entry}
        size, digest = entry.get("size"), entry.get("sha256", "")
        if type(size) is not int or size < 0 or not isinstance(digest, str):
            return f"{name} is malformed: the entry of {file} has no valid size or digest"
        entries[file] = entry
    if not entries:
        return f"{name} lists no files"
    if required is not None and required not in entries:
        return f"{name} does not list {required} (every checkpoint holds one)"
    return entries


def record_problem(folder: str | os.PathLike, name: str, required: str | None = None) -> str | None:
    """What makes the files `folder/name` records incomplete or damaged ("x.pt is 40 bytes, 128 recorded"), or None."""
    folder = Path(folder)
    record = read_checkpoint_record(folder, name)
    if record is None:
        return f"{name} is unreadable" if (folder / name).exists() else f"no {name}"
    entries = _recorded_entries(record["files"], name, required)
    if isinstance(entries, str):
        return entries
    missing = [file for file in entries if not (folder / file).is_file()]
    if missing:
        return f"missing {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    for file, entry in entries.items():
        if (actual := (folder / file).stat().st_size) != entry["size"]:
            return f"{file} is {actual:,} bytes, {entry['size']:,} recorded (truncated)"
    stamp = (str(folder.resolve()), (folder / name).stat().st_mtime_ns,
             tuple((file, (folder / file).stat().st_mtime_ns) for file in sorted(entries)))  # fmt: skip
    if stamp in _VERIFIED:
        return None
    for file, entry in entries.items():
        if entry.get("sha256") and file_digest(folder / file) != entry["sha256"]:
            return (
                f"{file} has the recorded size but not the recorded content (SHA-256 differs: its bytes changed "
                "after the save, e.g. a power loss or a copy cut short)"
            )
    _VERIFIED.add(stamp)
    return None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """What makes `folder` an incomplete or damaged checkpoint ("x.pt is 40 bytes, 128 recorded"), or None. Without
    a record it is incomplete: a save cut short and another Trainer's save look alike (both may parse)."""
    folder = Path(folder)
    if not folder.is_dir():
        return "it is not a folder"
    if not (folder / CHECKPOINT_RECORD).exists():
        if not _CHECKPOINT.match(folder.name) and not any(any(folder.glob(g)) for g in _TRAINING_STATE_FILES):
            return NOT_A_CHECKPOINT
        return NO_RECORD
    return record_problem(folder, CHECKPOINT_RECORD, required=TRAINER_STATE)


def final_output_problem(output_dir: str | os.PathLike, step: int) -> str | None:
    """What keeps the final outputs of `output_dir` from being the complete outputs of step `step`, or None."""
    problem = record_problem(output_dir, FINAL_RECORD)
    run = (read_checkpoint_record(output_dir, FINAL_RECORD) or {}).get("run")
    recorded = run.get("step") if isinstance(run, dict) else None
    return problem if problem is not None or recorded == step else f"they are of step {recorded}, not {step}"


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
        vouch = (
            f"; if another Trainer wrote it and you trust its files, record them first: python -m "
            f"trl_groupopt.runfolder.checkpoints {resume_from_checkpoint}"
        )
        raise ValueError(
            f"Cannot resume from {resume_from_checkpoint}: {problem}. Resume from the newest complete checkpoint "
            f"instead (resume_from_checkpoint=True, or --resume_from_checkpoint last with --output_dir {parent})"
            f"{vouch if problem == NO_RECORD else ''}."
        )
    return str(resume_from_checkpoint)


def _safetensors_problem(path: Path) -> str | None:
    """What keeps the safetensors file at `path` from loading (its header, or data shorter than it says), or None."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            header = json.loads(handle.read(length)) if 0 < length <= size - 8 else None
        except ValueError:
            header = None
    try:
        entries = [entry for key, entry in header.items() if key != "__metadata__"]
        end = max((int(entry["data_offsets"][1]) for entry in entries), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return f"{path.name} has no readable safetensors header ({size:,} bytes)"
    if end != size - 8 - length:
        return f"{path.name} holds {size - 8 - length:,} bytes of tensor data, its header says {end:,} (truncated)"
    return None


def _file_problem(path: Path) -> str | None:
    """What keeps one file of a checkpoint from loading, by its kind (safetensors, JSON, torch's zip), or None."""
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix == ".json" and read_json(path) is None:
        return f"{path.name} is not valid JSON ({path.stat().st_size:,} bytes)"
    if path.suffix in (".bin", ".pt", ".pth"):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError):
            bad = "its archive"
        if bad is not None:
            return f"{path.name} does not load: {bad} is damaged or cut short"
    return None


def vouch_problem(folder: str | os.PathLike) -> str | None:
    """What keeps another Trainer's checkpoint `folder` from being vouched for: it must hold a trainer state and
    weights, and every file must load as its kind (a truncated safetensors file or JSON is refused), or None."""
    folder = Path(folder)
    if (problem := checkpoint_problem(folder)) != NO_RECORD:
        return problem or "it is recorded and complete already"
    if not (folder / TRAINER_STATE).is_file():
        return f"no {TRAINER_STATE} (an empty folder, or not a Trainer's checkpoint)"
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        return "no model weights (*.safetensors or *.bin)"
    if not isinstance(read_json(folder / TRAINER_STATE), dict):
        return f"{TRAINER_STATE} is not a JSON object ({(folder / TRAINER_STATE).stat().st_size:,} bytes)"
    return next((p for f in sorted(folder.rglob("*")) if f.is_file() and (p := _file_problem(f))), None)


def vouch(names: list[str]) -> int:
    """The vouching command (the module docstring): record each named checkpoint's files as they are, after
    checking they load and that no live run holds its output folder (a run's checkpoint mid-save). Exit status."""
    from .lock import OutputFolderInUseError, RunLock

    if not names:
        print(
            f"usage: python -m trl_groupopt.runfolder.checkpoints CHECKPOINT [CHECKPOINT ...]\n{__doc__}",
            file=sys.stderr,
        )
        return 2
    for name in names:
        try:
            with RunLock(Path(name).resolve().parent):  # never a live run's checkpoint, mid-save
                if (problem := vouch_problem(name)) is not None:
                    print(f"{name}: {problem}; nothing written.", file=sys.stderr)
                    return 1
                write_checkpoint_record(name)
        except (OSError, ValueError, OutputFolderInUseError) as error:
            fix = f"; make it writable (chmod -R u+w {name})" if isinstance(error, PermissionError) else ""
            print(f"{name}: cannot record it: {error}{fix}", file=sys.stderr)
            return 1
        print(f"recorded {name}: its files as they are now")
    return 0


if __name__ == "__main__":  # vouch for checkpoints another Trainer wrote (see the module docstring)
    sys.exit(vouch(sys.argv[1:]))
