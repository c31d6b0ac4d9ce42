"""Resume rules, one story for the command line and the Python API: docs/reliability.md, "Resume is one story"
(`trl_groupopt.runfolder.checkpoints` decides which checkpoints are complete). No TRL or torch at import: the CLI reads it."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .checkpoints import TRAINER_STATE, checkpoints, read_checkpoint_record, read_json, resolve_resume

#: Files a finished run leaves in its output folder (the model, the state, the CLI's results).
_FINISHED_RUN_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                       "pytorch_model.bin", "trainer_state.json", "results.json")  # fmt: skip
#: Settings a resume compares with the checkpoint's (the learning rate is restored; the others are used as given).
RESUME_SETTINGS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                   "steps_per_generation", "num_iterations", "world_size", "advantage_estimator")  # fmt: skip


def refuse_fresh_run(output_dir: str | os.PathLike, overwrite: bool, *, cli: bool = False) -> None:
    """Raise `ValueError` when a fresh run into `output_dir` would replace an earlier run, unless `overwrite`."""
    found = checkpoints(output_dir)
    finished = [name for name in _FINISHED_RUN_FILES if Path(output_dir, name).is_file()]
    if overwrite or not (found or finished):
        return
    if found:
        what = "checkpoints (" + ", ".join(p.name for p in found[:3]) + (", ..." if len(found) > 3 else "") + ")"
    else:
        what = f"a finished run ({', '.join(finished)})"
    if cli:
        ways = "--resume_from_checkpoint last", "--output_dir", "--overwrite_output_dir (deleting its checkpoints)"
    else:
        ways = "train(resume_from_checkpoint=True)", "output_dir", "args.overwrite_output_dir = True"
    raise ValueError(
        f"The output folder {output_dir} already holds {what} of an earlier run; a fresh run would replace them. "
        f"Resume it with {ways[0]} (or a checkpoint's path), or start anew with another {ways[1]} or with {ways[2]}."
    )


def run_record(trainer: Any) -> dict[str, Any]:
    """The record's "run": the trainer's method, `RESUME_SETTINGS` and the epochs (which end a `max_steps=-1` run)."""
    names = (*RESUME_SETTINGS, "num_train_epochs", "max_steps")
    return {"method": _method_name(trainer), "settings": {name: getattr(trainer.args, name, None) for name in names}}


def _recorded_run(checkpoint: str) -> dict[str, Any]:
    return (read_checkpoint_record(checkpoint) or {}).get("run") or {}  # {} for records older than "run"


def check_resume(checkpoint: str, method: str, args: Any, *, warn: bool = True) -> None:
    """Refuse a checkpoint of another method; with `warn`, name each setting that changed and set the learning rate
    back to the checkpoint's (which the restored optimizer and scheduler go on using)."""
    run = _recorded_run(checkpoint)
    recorded_method = run.get("method")
    if recorded_method is not None and recorded_method != method:
        raise ValueError(
            f"Cannot resume {checkpoint} with {method}: it is a checkpoint of a {recorded_method} run. Resume it "
            f"with {recorded_method} (--method {recorded_method}), or start a new {method} run from its weights: "
            f"--model_name_or_path {checkpoint} with another --output_dir (model={checkpoint!r} in Python)."
        )
    settings = run.get("settings") or {}
    changed = {name: (settings[name], getattr(args, name, None)) for name in RESUME_SETTINGS
               if settings.get(name) is not None and settings[name] != getattr(args, name, None)}  # fmt: skip
    if not changed or not warn:
        return
    said = ", ".join(f"{name} {was} -> {now}" for name, (was, now) in changed.items())
    if "learning_rate" in changed:
        args.learning_rate = changed["learning_rate"][0]
        said += (
            f". The restored optimizer and scheduler keep the checkpoint's learning rate ({args.learning_rate}), "
            f"recorded as used; to change it, start a new run from its weights (--model_name_or_path {checkpoint})"
        )
    if changed.keys() - {"learning_rate"}:
        said += ". The batch and group settings given now are used: the resumed run is not the checkpoint's run"
    warnings.warn(f"Resuming {checkpoint} with changed settings: {said}.", UserWarning, stacklevel=3)


def finished_message(checkpoint: str, args: Any) -> str | None:
    """A line saying the run is finished when `checkpoint` is already at the run's last step, else None."""
    state = read_json(Path(checkpoint, TRAINER_STATE)) or {}
    step = state.get("global_step")
    limit = args.max_steps if getattr(args, "max_steps", -1) > 0 else None
    if limit is None:  # a run by epochs: finished at the step count the checkpoint's own run planned
        settings = _recorded_run(checkpoint).get("settings") or {}
        if settings.get("num_train_epochs") == getattr(args, "num_train_epochs", None):
            limit = state.get("max_steps")
    if not isinstance(step, int) or not isinstance(limit, int) or limit <= 0 or step < limit:
        return None
    return (
        f"The run is finished: {checkpoint} is at step {step} of {limit}. Nothing was trained or written; raise "
        "--max_steps (max_steps) to train on."
    )


def _method_name(trainer: Any) -> str:
    return getattr(getattr(trainer, "method_spec", None), "name", type(trainer).__name__)


def prepare_train(trainer: Any, resume_from_checkpoint: str | bool | None) -> tuple[str | None, str | None]:
    """The resume rules, run once per run by `GroupOptTrainer.train()` (the Python API and the command line):
    `(checkpoint to resume from or None, None)`, or for a run already at its last step `(checkpoint, the line saying
    so)`. With `trainer.command_line` (the `trl-groupopt` command) the messages name its flags, and a fresh
    `--overwrite_output_dir` run deletes the earlier checkpoints (on the main process)."""
    args, cli = trainer.args, bool(getattr(trainer, "command_line", False))
    overwrite = bool(getattr(args, "overwrite_output_dir", False))
    if cli and overwrite and resume_from_checkpoint not in (None, False):
        raise ValueError("--overwrite_output_dir (a fresh run) cannot be combined with --resume_from_checkpoint.")
    checkpoint = resolve_resume(args.output_dir, resume_from_checkpoint)
    if checkpoint is None:
        refuse_fresh_run(args.output_dir, overwrite, cli=cli)
        if cli and overwrite and getattr(args, "process_index", 0) == 0:
            for folder in checkpoints(args.output_dir):
                shutil.rmtree(folder)
        return None, None
    check_resume(checkpoint, _method_name(trainer), args)
    message = finished_message(checkpoint, args)
    return checkpoint, message if cli or message is None else message.replace("--max_steps (max_steps)", "max_steps")


def missing_keys_to_report(model: Any, missing_keys: list[str]) -> list[str]:
    """`missing_keys` less the weights tied to another parameter that was loaded (e.g. `lm_head.weight` of a model
    with `tie_word_embeddings`: safetensors stores a shared tensor once, and the tie restores it)."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    loaded = {p.data_ptr() for name, p in parameters.items() if name not in missing_keys}
    return [name for name in missing_keys if name not in parameters or parameters[name].data_ptr() not in loaded]


def _free_bytes(folder: str | os.PathLike) -> int | None:
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


@contextlib.contextmanager
def disk_full_explained(folder: str | os.PathLike) -> Iterator[None]:
    """Within it, a save that fails for want of space raises one line saying so, naming `folder`."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        said, seen = False, err
        while seen is not None and not said:
            said = (isinstance(seen, OSError) and seen.errno == errno.ENOSPC) or "No space left" in str(seen)
            seen = seen.__cause__ or seen.__context__
        free = _free_bytes(folder)  # torch's writer reports a full disk as "basic_ios::clear: iostream error"
        if not said and (free is None or free >= 64 << 20):
            raise
        raise OSError(
            errno.ENOSPC,
            f"No space left on the device while saving {folder} ({free or 0:,} bytes free; {err}). "
            "A partial checkpoint has no completion record and is skipped on resume; free space or choose another "
            "output_dir, then resume with --resume_from_checkpoint last (resume_from_checkpoint=True in Python).",
        ) from err


def inexact_resume_warning(args: Any) -> str | None:
    """A line naming why `save_steps` would resume mid generation cycle (inexactly), or None."""
    if str(getattr(args, "save_strategy", "no")).split(".")[-1].lower() != "steps":
        return None
    save_steps = args.save_steps
    if not isinstance(save_steps, int | float) or save_steps < 1 or save_steps != int(save_steps):
        return None  # a fraction of the run: the step is not known here
    accumulation = args.gradient_accumulation_steps
    micro_steps = (getattr(args, "steps_per_generation", None) or accumulation) * getattr(args, "num_iterations", 1)
    cycle = micro_steps // math.gcd(micro_steps, accumulation)  # optimizer steps between generation boundaries
    if int(save_steps) % cycle == 0:
        return None
    return (
        f"save_steps={int(save_steps)} saves inside a generation cycle of {cycle} optimizer steps "
        f"(steps_per_generation * num_iterations / gradient_accumulation_steps = {micro_steps}/{accumulation}): a run "
        f"resumed from such a checkpoint regenerates its batch and differs from an uninterrupted one. Use a multiple "
        f"of {cycle} (e.g. save_steps={cycle * max(1, round(save_steps / cycle))}) for an exact resume."
    )
