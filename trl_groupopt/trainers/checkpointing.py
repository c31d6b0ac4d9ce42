"""The trainer's side of `trl_groupopt.run_folder`: the hooks `GroupOptTrainer` calls at each run-folder event.

- `RunFolder.training(resume_from_checkpoint)`: around `train()`; holds the output folder's lock (main process), so a
  second run into the same folder refuses, and resolves the checkpoint to resume from: the newest *complete* one for
  `True` / `"last"` (incomplete newer ones are skipped with a warning), an explicit path only if complete.
- `RunFolder.saving_checkpoint(folder)`: around transformers' `_save_checkpoint`; the folder's completion record is
  removed before (a re-save cut short must not pass for the earlier save) and written once every process has saved.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..run_folder import RunLock, remove_checkpoint_record, resolve_resume, write_checkpoint_record

__all__ = ["RunFolder"]


class RunFolder:
    """The run-folder rules of one trainer (see the module docstring)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    @contextmanager
    def training(self, resume_from_checkpoint: str | bool | None) -> Iterator[str | None]:
        """Lock the output folder for the run; yields the checkpoint to resume from (None: a fresh run)."""
        args = self.trainer.args
        with RunLock(args.output_dir, enabled=args.process_index == 0):
            yield resolve_resume(args.output_dir, resume_from_checkpoint)

    @contextmanager
    def saving_checkpoint(self, folder: str) -> Iterator[None]:
        """Around the checkpoint save into `folder`: its completion record follows every process's part."""
        trainer = self.trainer
        if trainer.args.should_save:
            remove_checkpoint_record(folder)
        yield
        trainer.accelerator.wait_for_everyone()
        if trainer.args.should_save and os.path.isdir(folder):
            write_checkpoint_record(folder)
