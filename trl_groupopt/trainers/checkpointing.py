"""The run-folder hooks `GroupOptTrainer` calls (`trl_groupopt.run_folder` holds the rules): `training` around
`train()` (the output folder's lock; the complete checkpoint to resume from), `saving_checkpoint` around each
checkpoint save (its completion record removed before, written once every process has saved)."""

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
