"""`RunFolderMixin`: the trainer's side of `trl_groupopt.run_folder` (complete checkpoints, resume, the run lock).

- `train(resume_from_checkpoint=True)` resumes from the newest *complete* checkpoint (incomplete newer ones are
  skipped with a warning naming the folder and what is missing), and an explicit checkpoint path must be complete;
  `"last"` is accepted as `True` (the CLI's spelling).
- Each checkpoint gets its completion record once every process has written its part.
- `train()` holds the output folder's lock (main process), so a second run into the same folder refuses.
- The resume rules of `trl_groupopt.resume` (a fresh run over an earlier one, another method's checkpoint, changed
  settings, a finished run), a full disk named as such, no "missing keys" warning for a tied weight.
"""

from __future__ import annotations

import os

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..resume import disk_full_explained, missing_keys_to_report, prepare_train, run_record
from ..run_folder import RunLock, remove_checkpoint_record, write_checkpoint_record

__all__ = ["RunFolderMixin"]


class RunFolderMixin:
    """Mixed into `GroupOptTrainer` before `GRPOTrainer` (see the module docstring)."""

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """transformers' `train`, resuming only from complete checkpoints, with the output folder locked."""
        with RunLock(self.args.output_dir, enabled=self.args.process_index == 0):
            checkpoint, finished = prepare_train(self, resume_from_checkpoint)  # the resume rules (resume.py)
            if finished is not None:
                return finished
            return super().train(
                resume_from_checkpoint=checkpoint, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval, **kwargs
            )

    def _save_checkpoint(self, model, trial) -> None:
        """transformers' checkpoint, then its completion record (written once every process has saved its part)."""
        # mirrors Trainer._save_checkpoint (transformers 5.24): the checkpoint folder's path
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            remove_checkpoint_record(folder)  # a re-save cut short must not pass for the earlier save
        with disk_full_explained(folder):
            super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()
        if self.args.should_save and os.path.isdir(folder):
            write_checkpoint_record(folder, run_record(self))

    def _issue_warnings_after_load(self, load_result) -> None:
        """transformers' warnings, less a tied weight reported missing (restored by the tie: `resume.py`)."""
        if hasattr(load_result, "_replace"):
            load_result = load_result._replace(
                missing_keys=missing_keys_to_report(self.model, load_result.missing_keys)
            )
        super()._issue_warnings_after_load(load_result)
