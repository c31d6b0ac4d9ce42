"""The library's contact points with TRL's and transformers' private side, outside the `# mirrors` blocks:
:class:`TRLHooks`, `GroupOptTrainer`'s base, overrides each TRL hook the trainer wraps (all but the loss path and
`train`, which `base.py` holds), and the functions below read TRL's private state by name. A TRL upgrade re-reads
this module and the mirror blocks (`python scripts/trl_mirrors.py` lists them; docs/trl-upgrade.md)."""

from __future__ import annotations

import math
import os
from typing import Any

from transformers import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints
from trl import GRPOTrainer
from trl.trainer.utils import split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid

from ..data import checks
from ..methods.registry import spec_for
from ..methods.spec import Paper
from ..runfolder.checkpoints import TRAINER_STATE, remove_record, write_checkpoint_record
from ..runfolder.resume import disk_full_explained, missing_keys_to_report, run_record
from . import batching, guard
from .config import tokens_withheld
from .report import MechanismReportCallback


class _FromSpec:
    """TRL's card metadata (`_name`, `_tag_names`, `_paper`) from the class's registered spec (else GRPOTrainer's)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type) -> Any:
        spec = spec_for(owner)
        if spec is None:
            return getattr(GRPOTrainer, self.name)
        paper = spec.paper.trl_fields() if isinstance(spec.paper, Paper) else {"title": str(spec.paper)}
        card = {"_name": spec.display_name, "_tag_names": ["trl", spec.name, "trl-groupopt"], "_paper": paper}
        return card[self.name]


class TRLHooks(GRPOTrainer):
    """The TRL hooks `GroupOptTrainer` wraps around TRL's own (each calls it): whole-group batches, the raw rewards and
    their checks, the energy capture, the non-finite guard, the run folder's records, token-free saves and the
    mechanism report's metrics. They read what `GroupOptTrainer.__init__` sets (`whole_groups`, `_energy`, ...)."""

    _name, _tag_names, _paper = _FromSpec(), _FromSpec(), _FromSpec()  # TRL's card metadata, from the spec

    @property
    def display_name(self) -> str:
        """The method's name on the model card (TRL's `_name`)."""
        return self._name

    def _prepare_inputs(self, generation_batch):
        if not self.whole_groups or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        return prepare_whole_groups(self, generation_batch)

    def _generate_and_score_completions(self, inputs):
        self._raw_rewards_per_func = None  # filled by `_calculate_rewards` during TRL's call
        if self._energy is not None:
            self._energy.records = []
        logged = len(self._metrics["train"].get("frac_reward_zero_std", ()))
        output = super()._generate_and_score_completions(inputs)
        # whether this rollout can teach: TRL's value for it, when this rollout logged one (a generation a subclass
        # replaces may log none; never read a value an earlier rollout left)
        fractions = self._metrics["train"].get("frac_reward_zero_std", ())
        if (report := self._report_callback) is not None and self.model.training and len(fractions) > logged:
            report.signal.rollout(fractions[-1])
        if self._energy is not None:
            self._energy.add_behaviour_energy(output)
        return batching.add_batch_fields(self, output, inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Environment-owned rewards (`get_reward`) are one more column of TRL's (N_global, F) matrix, with weight 1.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        checks.check_finite_rewards(rewards_per_func, self.reward_func_names)  # +-inf fails, naming the function
        checks.check_reward_scale(self, rewards_per_func)  # so large that the group mean overflows: fails, naming it
        checks.watch_all_none_rewards(self, rewards_per_func, inputs)  # warn (then stop, for the method configs)
        self._raw_rewards_per_func = rewards_per_func  # (N_global, F), gathered over processes
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        trl_forward = super()._get_per_token_logps_and_entropies
        if self._energy is None:
            return trl_forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        return self._energy.recorded(trl_forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        guard.check_grad_norm(self, grad_norm)
        return grad_norm

    def _flush_metrics(self) -> None:
        """Log the queued metrics (one collective, one sync) and show them to the mechanism report: with
        `log_step_metric`, the one place the loss path writes TRL's `_metrics`."""
        report = self._report_callback
        for mode, name, value in self._metrics_queue.flush(self.accelerator):
            self._metrics[mode][name].append(value)
            if mode == "train" and report is not None:
                report.tracker.record(name, value)

    def log_step_metric(self, name: str, value: float) -> None:
        """Log `value` under `name` with the trainer's next log (averaged over the values since)."""
        self._metrics["train"][name].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        report = self._report_callback
        if report is not None and self.model.training:  # the `acted/<method>` of the steps since the last log
            for name, value in report.pending:
                self.log_step_metric(name, value)
            report.pending = []
        super().log(logs, start_time)

    @property
    def _report_callback(self) -> MechanismReportCallback | None:
        handler = self.__dict__.get("callback_handler")
        callbacks = handler.callbacks if handler else []
        return next((cb for cb in callbacks if isinstance(cb, MechanismReportCallback)), None)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """transformers' `_save` (weights checked finite, `training_args.bin` without the token), then our card."""
        guard.check_weights(self, state_dict, output_dir)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        with tokens_withheld(), disk_full_explained(output_dir):
            super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            from .card import portable_adapter_config

            if self.args.push_to_hub:  # what the Hub gets names the embedded policy portably; a local folder keeps
                portable_adapter_config(output_dir)  # PEFT's absolute path, which loads from any working directory
            self.create_model_card(output_dir=output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        # mirrors Trainer._save_checkpoint (transformers 5.24): the checkpoint folder's path, and its rotation moved
        # after our record (a run killed in between would otherwise have deleted its last complete checkpoint)
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            remove_record(folder)  # a re-save cut short must not pass for the earlier save
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            with disk_full_explained(folder):
                super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()  # the completion record follows every process's part
        if self.args.should_save and os.path.isdir(folder):
            write_checkpoint_record(folder, run_record(self))
            rotate_checkpoints(run_dir, limit, self.state.best_model_checkpoint, use_mtime=True)

    def _issue_warnings_after_load(self, load_result) -> None:
        """transformers' warnings, less a tied weight reported missing (restored by the tie)."""
        # every caller in transformers 5.24 passes torch's `_IncompatibleKeys`, a named tuple
        load_result = load_result._replace(missing_keys=missing_keys_to_report(self.model, load_result.missing_keys))
        super()._issue_warnings_after_load(load_result)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        with tokens_withheld():
            super()._push_from_checkpoint(checkpoint_folder)


def micro_step(trainer: GRPOTrainer) -> int:
    """TRL's micro-step counter (`_step`): which buffered micro-batch `_prepare_inputs` serves next."""
    return trainer._step


def buffered_batches(trainer: GRPOTrainer) -> list[dict[str, Any]] | None:
    """TRL's buffered generation batch (`_buffered_inputs`), one entry per micro-step; None outside its loop."""
    return trainer._buffered_inputs


def finished_run_output(trainer: GRPOTrainer, checkpoint: str) -> TrainOutput:
    """What `train()` returns for a run already at its last step: the checkpoint's state and weights, no step."""
    trainer.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
    trainer._load_from_checkpoint(checkpoint)
    losses = [entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry]
    return TrainOutput(trainer.state.global_step, losses[-1] if losses else math.nan, {})


def prepare_whole_groups(trainer: GRPOTrainer, generation_batch):
    """TRL's `_prepare_inputs` in training, with whole groups kept together in the shuffle (`batching`)."""
    # mirrors GRPOTrainer._prepare_inputs (trl 1.16.0): the train branch; only the shuffle differs
    t = trainer
    generate_every = t.args.steps_per_generation * t.num_iterations
    if t._step % generate_every == 0 or t._buffered_inputs is None:
        generation_batch = t._generate_and_score_completions(generation_batch)
        generation_batch = split_pixel_values_by_grid(generation_batch)
        generation_batch = batching.shuffle_whole_groups(generation_batch, generation_batch["group_ids"])
        generation_batches = split_tensor_dict(generation_batch, t.args.steps_per_generation)
        t._buffered_inputs = [unsplit_pixel_values_by_grid(batch) for batch in generation_batches]
    return t._buffered_inputs[t._step % t.args.steps_per_generation]
