"""The run-folder hooks `GroupOptTrainer` calls around `train()` and each checkpoint save (the rules:
`trl_groupopt.run_folder`, `trl_groupopt.resume`; docs/reliability.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..resume import disk_full_explained, prepare_train, run_record
from ..run_folder import RunLock, remove_checkpoint_record, write_checkpoint_record


class RunFolder:
    def __init__(self, trainer) -> None:
        self.trainer = trainer

    @contextmanager
    def training(self, resume_from_checkpoint: str | bool | None) -> Iterator[tuple[str | None, Any]]:
        """Lock the output folder for the run; yields `(checkpoint to resume from or None, None)`, or
        `(checkpoint, output)` for a finished run: `train()` then returns `output` without a step (`resume.py`)."""
        trainer = self.trainer
        with RunLock(trainer.args.output_dir, enabled=trainer.args.process_index == 0):
            yield prepare_train(trainer, resume_from_checkpoint)

    @contextmanager
    def saving_checkpoint(self, folder: str) -> Iterator[None]:
        """Around the checkpoint save into `folder`: its completion record follows every process's part."""
        trainer = self.trainer
        if trainer.args.should_save:
            remove_checkpoint_record(folder)  # a re-save cut short must not pass for the earlier save
        with disk_full_explained(folder):
            yield
        trainer.accelerator.wait_for_everyone()
        if trainer.args.should_save and os.path.isdir(folder):
            write_checkpoint_record(folder, run_record(trainer))
