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

from .checkpoints import (
    FINAL_RECORD,
    TRAINER_STATE,
    checkpoint_problem,
    checkpoints,
    final_output_problem,
    newest_complete_checkpoint,
    read_checkpoint_record,
    read_json,
    resolve_resume,
)

#: Files a finished run leaves in its output folder (the model, the state, the CLI's results).
_FINISHED_RUN_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                       "pytorch_model.bin", "trainer_state.json", "results.json")  # fmt: skip
#: Settings a resume compares with the checkpoint's (the learning rate is restored; the others are used as given).
RESUME_SETTINGS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                   "steps_per_generation", "num_iterations", "world_size", "advantage_estimator")  # fmt: skip
#: Where a fresh run keeps the incomplete checkpoints of an output folder that holds no complete one.
SET_ASIDE = "incomplete_checkpoints"


def _complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints of `output_dir`, or none when none of them is complete (nothing there can be resumed: the
    same test as resuming's, so a folder that cannot be resumed never refuses a fresh run)."""
    found = checkpoints(output_dir)
    return found if found and newest_complete_checkpoint(output_dir, warn=False) is not None else []


def set_aside_incomplete(output_dir: str | os.PathLike) -> str | None:
    """A fresh run into `output_dir` whose checkpoints are all incomplete (a save cut short by SIGKILL or a full
    disk): they are kept aside in ``output_dir/incomplete_checkpoints/`` (moved, not deleted: a checkpoint another
    Trainer wrote looks the same) and the line saying so is returned; None when there were none."""
    found = checkpoints(output_dir)
    if not found or _complete_checkpoints(output_dir):
        return None
    aside = Path(output_dir, SET_ASIDE)
    aside.mkdir(exist_ok=True)
    problems = [f"{folder.name}: {checkpoint_problem(folder)}" for folder in found[:3]]
    for folder in found:
        target, n = aside / folder.name, 1
        while target.exists():  # from an earlier fresh start
            target, n = aside / f"{folder.name}.{n}", n + 1
        folder.rename(target)
    more = ", ..." if len(found) > 3 else ""
    return (
        f"Starting afresh in {output_dir}: it held only incomplete checkpoints ({'; '.join(problems)}{more}), which "
        f"cannot be resumed; they are kept in {aside} (delete it to free the space; to vouch for one another Trainer "
        f"wrote: python -m trl_groupopt.runfolder.checkpoints PATH)."
    )


def refuse_fresh_run(output_dir: str | os.PathLike, overwrite: bool, *, cli: bool = False) -> None:
    """Raise `ValueError` when a fresh run into `output_dir` would replace an earlier run, unless `overwrite`; only
    incomplete checkpoints are no earlier run (a fresh run sets them aside: :func:`set_aside_incomplete`)."""
    found = _complete_checkpoints(output_dir)
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
    return {"method": method_name(trainer), "settings": {name: getattr(trainer.args, name, None) for name in names}}


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


def training_complete(checkpoint: str, args: Any) -> tuple[int, int] | None:
    """(step, last step) when `checkpoint` is already at the run's last step (its training is complete), else None."""
    state = read_json(Path(checkpoint, TRAINER_STATE)) or {}
    step = state.get("global_step")
    limit = args.max_steps if getattr(args, "max_steps", -1) > 0 else None
    if limit is None:  # a run by epochs: finished at the step count the checkpoint's own run planned
        settings = _recorded_run(checkpoint).get("settings") or {}
        if settings.get("num_train_epochs") == getattr(args, "num_train_epochs", None):
            limit = state.get("max_steps")
    if not isinstance(step, int) or not isinstance(limit, int) or limit <= 0 or step < limit:
        return None
    return step, limit


def method_name(trainer: Any) -> str:
    """The registry name of the method `trainer` trains (its class name for a class that is none)."""
    return getattr(getattr(trainer, "method_spec", None), "name", type(trainer).__name__)


def decide(args: Any, method: str, resume_from_checkpoint: str | bool | None, *, cli: bool = False):
    """The resume rules, once per run (`trl_groupopt.runfolder.run.open_run`), for the Python API and (`cli`, whose
    messages name its flags) the command line: `(checkpoint to resume from or None, done, finished)`. `done`: the
    line saying the checkpoint is at the run's last step (nothing to train); `finished`: the command line's final
    outputs are complete too, so nothing at all is left to do (else the command writes them from the checkpoint)."""
    out, overwrite = args.output_dir, bool(getattr(args, "overwrite_output_dir", False))
    if cli and overwrite and resume_from_checkpoint not in (None, False):
        raise ValueError("--overwrite_output_dir (a fresh run) cannot be combined with --resume_from_checkpoint.")
    checkpoint = resolve_resume(out, resume_from_checkpoint)
    if checkpoint is None and cli and not overwrite and (same := _same_run_finished(args, method)) is not None:
        return same
    if checkpoint is None:
        refuse_fresh_run(out, overwrite, cli=cli)
        said = None if overwrite or getattr(args, "process_index", 0) else set_aside_incomplete(out)
        if said is not None and cli:
            print(said, flush=True)
        elif said is not None:
            warnings.warn(said, UserWarning, stacklevel=4)
        return None, None, False
    check_resume(checkpoint, method, args)
    if (complete := training_complete(checkpoint, args)) is None:
        return checkpoint, None, False
    step, limit = complete
    if not cli:
        done = f"The run is finished: {checkpoint} is at step {step} of {limit}. Nothing was trained or written"
        return checkpoint, f"{done}; raise max_steps to train on.", False
    problem = final_output_problem(out, step)
    if problem is None:
        done = (
            f"The run is finished: {out} holds its final model and results, of step {step} of {limit} ({checkpoint})"
        )
        return checkpoint, f"{done}. Nothing was trained or written; raise --max_steps to train on.", True
    done = f"{checkpoint} is at the run's last step ({step} of {limit}), but its final outputs are not complete"
    return checkpoint, f"{done} ({problem}): writing them from that checkpoint, without training.", False


def _same_run_finished(args: Any, method: str) -> tuple[str, str, bool] | None:
    """The same command run again over its finished run (the same method and settings, its checkpoint at the last
    step, its final outputs complete): `decide`'s answer for a finished run (exit 0, one line), else None (a fresh
    run over an earlier one: refused). `accelerate launch` turns any failure into its own traceback."""
    if not Path(args.output_dir, FINAL_RECORD).exists():  # no final outputs: not finished (and nothing is read)
        return None
    checkpoint = newest_complete_checkpoint(args.output_dir, warn=False)
    if checkpoint is None or _recorded_run(checkpoint).get("method") != method:
        return None
    settings = _recorded_run(checkpoint).get("settings") or {}
    if any(settings.get(name) != getattr(args, name, None) for name in (*RESUME_SETTINGS, "max_steps")):
        return None
    complete = training_complete(checkpoint, args)
    if complete is None or final_output_problem(args.output_dir, complete[0]) is not None:
        return None
    done = (
        f"The run is finished: {args.output_dir} holds the final model and results of this same command, step "
        f"{complete[0]} of {complete[1]} ({checkpoint}). Nothing was trained or written; to train again use "
        "--overwrite_output_dir or another --output_dir, to train on raise --max_steps with --resume_from_checkpoint last."
    )
    return checkpoint, done, True


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


class DiskFullError(OSError):
    """A save that ran out of space, said in one line (the command line prints it so, even mid-training)."""


def _says_disk_full(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:  # safetensors' writer: "... IoError(Os { code: 28, kind: StorageFull, ... })"
        if (isinstance(seen, OSError) and seen.errno == errno.ENOSPC) or any(
            words in str(seen) for words in ("No space left", "StorageFull", "os error 28")
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def disk_full_explained(folder: str | os.PathLike) -> Iterator[None]:
    """Within it, a save that fails for want of space raises one line saying so, naming `folder` (`DiskFullError`)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as err:
        free = _free_bytes(folder)  # torch's writer reports a full disk as "basic_ios::clear: iostream error"
        low = isinstance(err, OSError | RuntimeError) and free is not None and free < 64 << 20
        if not (_says_disk_full(err) or low):
            raise
        if Path(folder).name.startswith("checkpoint-"):
            after = "A partial checkpoint has no completion record and is skipped on resume; free space or choose "
            if newest_complete_checkpoint(Path(folder).parent, warn=False) is not None:
                after += (
                    "another output_dir, then resume with --resume_from_checkpoint last (resume_from_checkpoint=True)"
                )
            else:  # its first: nothing to resume, and a fresh run sets the partial one aside
                after += f"another output_dir, then run it again afresh (it keeps the partial one in {SET_ASIDE}/)"
        elif newest_complete_checkpoint(folder, warn=False) is not None:
            after = "The final outputs there are incomplete; free space or choose another output_dir, then resume "
            after += "with --resume_from_checkpoint last, which writes them from the last checkpoint (Python: save "
            after += "again)"
        else:  # no checkpoint to write them from
            after = "The final outputs there are incomplete and no checkpoint holds the run; free space or choose "
            after += "another output_dir, then run it again with --overwrite_output_dir (Python: save again)"
        said = f"No space left on the device while saving {folder} ({free or 0:,} bytes free; {err}). {after}."
        raise DiskFullError(errno.ENOSPC, said) from err


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
