"""`GroupOptTrainer`: TRL's `GRPOTrainer` with the policy objective as a pluggable pure function. Each TRL hook the
library changes is overridden here, once, in the order a run meets it; with the default objective and estimator it *is*
TRL's GRPO/GSPO/DAPO (tests/trainers/test_base_parity.py). TRL upgrade checklist: docs/trl-upgrade.md."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..core.common import ObjectiveOutput, clipped_surrogate_loss
from ..core.estimators import AdvantageEstimator, estimator_of
from ..data import checks
from ..methods.mechanism import Mechanism, MechanismReport
from ..methods.registry import spec_for
from ..methods.spec import MethodSpec, Paper
from ..runfolder.checkpoints import remove_checkpoint_record, write_checkpoint_record
from ..runfolder.lock import RunLock
from ..runfolder.resume import disk_full_explained, missing_keys_to_report, prepare_train, run_record
from . import batching, guard, loss
from .args_check import check_numeric_args
from .compat import check_loss_routed_through_compute_loss, check_trl_scores_tokens, dropping_trl_warning
from .config import estimator_knobs, tokens_withheld
from .energy import EnergyCapture
from .metrics import MetricsQueue
from .report import MechanismReportCallback
from .schedule import check_dataset_holds_a_generation_batch, warn_if_inert_on_policy

__all__ = ["GroupOptTrainer"]


class _FromSpec:
    """TRL's card metadata (`_name`, `_tag_names`, `_paper`) from the class's registered spec (else GRPOTrainer's)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type) -> Any:
        spec = spec_for(owner, None)
        if spec is None:
            return getattr(GRPOTrainer, self.name)
        paper = spec.paper.trl_fields() if isinstance(spec.paper, Paper) else {"title": str(spec.paper)}
        return {"_name": spec.display_name, "_tag_names": ["trl", spec.name, "trl-groupopt"], "_paper": paper}[
            self.name
        ]


class GroupOptTrainer(GRPOTrainer):
    """`GRPOTrainer` whose policy objective is a pure function (see the module docstring)."""

    _name, _tag_names, _paper = _FromSpec(), _FromSpec(), _FromSpec()
    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig  # where the knobs are
    #: The objective needs whole groups (and `group_ids`) in every micro-batch (or a function of the config).
    requires_whole_groups: ClassVar[bool | Callable[[Any], bool]] = False
    supports_delta: ClassVar[bool] = True  # whether TRL's `delta` (two-sided surrogate clip) means anything here
    #: What happens to the mechanism on-policy (then it warns), e.g. "ECHO's batch clip never acts"; None: it acts.
    inert_on_policy: ClassVar[str | None] = None
    #: The objective applies TRL's per-token loss weights itself (keyword `loss_weights`, None when all are off).
    objective_applies_loss_weights: ClassVar[bool] = False
    #: Changes TRL's loss or advantages (derived per subclass): only a class without may run TRL's cispo/sapo/vespo.
    has_own_objective: ClassVar[bool] = False
    #: (text of a misleading TRL construction warning, the line logged in its place, formatted with `args`).
    replaces_trl_warning: ClassVar[tuple[str, str] | None] = None
    heldout_accuracy: dict[str, Any] | None = None  # {"before", "after", "num_examples"} when measured (the card)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "has_own_objective" not in cls.__dict__:
            cls.has_own_objective = (
                cls.objective is not GroupOptTrainer.objective
                or cls.compute_advantages is not GroupOptTrainer.compute_advantages
                or not estimator_of(cls.config_class).trl_advantages  # the config class's default estimator
            )

    # mirrors GRPOTrainer.__init__ (trl 1.16.0): the same parameters, order and defaults, so any GRPOTrainer call works
    def __init__(
        self, model, reward_funcs: Any | list[Any] | None = None, args: GRPOConfig | None = None, train_dataset=None,
        eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
        optimizers: tuple[Any, Any] = (None, None), quantization_config=None, peft_config=None,
        tools: list[Callable] | None = None, rollout_func: Callable | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
    ):  # fmt: skip
        if args is None:  # mirrors GRPOTrainer.__init__ (trl 1.16.0), with this method's config and run name
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = self.config_class(f"{model_name.split('/')[-1]}-{self._name.split()[0]}")
        self.validate_args(args)
        check_loss_routed_through_compute_loss(type(self), bool(args.use_liger_kernel))
        check_trl_scores_tokens()  # trl 1.15.0 without Triton (CPU builds of torch) has no log-prob kernel
        # Reward functions come back wrapped so a non-number fails with their name.
        reward_funcs = checks.prepare_trainer_inputs(reward_funcs, train_dataset, environment_factory)
        self._metrics_queue = MetricsQueue()
        self._energy: EnergyCapture | None = None
        replaced = self.replaces_trl_warning
        with dropping_trl_warning(replaced[0] if replaced else None) as dropped:
            super().__init__(
                model, reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                processing_class=processing_class, reward_processing_classes=reward_processing_classes,
                callbacks=callbacks, optimizers=optimizers, quantization_config=quantization_config,
                peft_config=peft_config, tools=tools, rollout_func=rollout_func, environment_factory=environment_factory,
            )  # fmt: skip
        if dropped:
            logging.getLogger(type(self).__module__).warning(replaced[1].format(args=self.args))
        self.estimator: AdvantageEstimator = estimator_of(self.args)
        self._estimator_knobs = estimator_knobs(self.args, self.estimator)
        if self.estimator.needs_energy:
            self._energy = EnergyCapture(self)  # after TRL's `__init__`, which patched the LM head
        self.whole_groups = self.needs_whole_groups(self.args)
        check_dataset_holds_a_generation_batch(self.args, self.train_dataset)
        warn_if_inert_on_policy(type(self).__name__, self.args, self.inert_on_policy)
        spec = self.method_for(self.args)
        report = MechanismReportCallback(spec.name if spec is not None else None, self.estimator.name)
        if report.tracker.mechanisms:
            self.add_callback(report)

    @classmethod
    def method_for(cls, args: Any) -> MethodSpec | None:
        return spec_for(cls, args)

    @classmethod
    def needs_whole_groups(cls, args: GRPOConfig) -> bool:
        needs = cls.requires_whole_groups
        return bool(needs(args) if callable(needs) else needs) or estimator_of(args).needs_whole_groups

    @property
    def group_size(self) -> int:
        return self.num_generations if self.model.training else self.num_generations_eval

    @classmethod
    def validate_args(cls, args: GRPOConfig) -> None:
        if not isinstance(args, cls.config_class):
            raise ValueError(
                f"{cls.__name__} reads its settings from a {cls.config_class.__name__}, got a {type(args).__name__}: "
                f"build the config with {cls.config_class.__name__}(...) (it accepts every GRPOConfig argument)."
            )
        check_numeric_args(cls.__name__, args)
        estimator = estimator_of(args)
        trl_loss = args.loss_type in loss.TRL_SURROGATE_LOSS_TYPES
        if args.loss_type not in loss.SUPPORTED_LOSS_TYPES and not (
            trl_loss and not cls.has_own_objective and estimator.trl_advantages
        ):
            # The one check for every trainer and estimator: TRL's loss would drop another objective or estimator.
            reason = (
                f"compute their loss from TRL's group-normalised advantages, which would drop the advantages of "
                f"advantage_estimator={estimator.name!r}"
                if trl_loss and not estimator.trl_advantages
                else "replace the policy surrogate itself (GroupOptTrainer with a GRPOConfig runs them with TRL's "
                "own loss)"
            )
            raise ValueError(
                f"loss_type={args.loss_type!r} is not supported by {cls.__name__}: TRL's cispo/sapo/vespo {reason}. "
                f"Use one of {loss.SUPPORTED_LOSS_TYPES}."
            )
        if args.delta is not None and not cls.supports_delta:
            raise ValueError(f"delta={args.delta} has no meaning for {cls.__name__}'s objective; leave delta=None.")
        if cls.needs_whole_groups(args):
            groups, batch_size = args.num_generations, args.per_device_train_batch_size
            if groups is None or groups < 2:
                raise ValueError(
                    f"{cls.__name__} compares the completions of a group: num_generations must be >= 2, got {groups}."
                )
            if batch_size % groups != 0:
                raise ValueError(
                    f"{cls.__name__} needs whole groups in every micro-batch: per_device_train_batch_size "
                    f"({batch_size}) must be a multiple of num_generations ({groups}). Use per_device_train_batch_size "
                    f"in {[groups * k for k in range(1, 5)]}, or a num_generations that divides {batch_size}."
                )

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """transformers' `train` in the locked run folder (docs/reliability.md), then the mechanism report: printed, or
        a warning when a mechanism never acted."""
        with RunLock(self.args.output_dir, enabled=self.args.process_index == 0):
            checkpoint, finished = prepare_train(self, resume_from_checkpoint)
            if finished is not None:  # a finished run: nothing trains, nothing changes (`resume.py`)
                return finished
            output = super().train(
                resume_from_checkpoint=checkpoint, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval, **kwargs
            )
        report = self.mechanism_report
        if report is not None and self.is_world_process_zero():
            if report.never_acted:
                warnings.warn(report.text, UserWarning, stacklevel=2)
            else:
                print(report.text, flush=True)
        return output

    def _prepare_inputs(self, generation_batch):
        if not self.whole_groups or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        return batching.prepare_whole_groups(self, generation_batch)

    def _generate_and_score_completions(self, inputs):
        self._raw_rewards_per_func = None  # filled by `_calculate_rewards` during TRL's call
        if self._energy is not None:
            self._energy.records = []
        output = super()._generate_and_score_completions(inputs)
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

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        output = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        guard.check_loss(self, model, output)
        return output

    def _compute_loss(self, model, inputs):
        if self.loss_type in loss.TRL_SURROGATE_LOSS_TYPES and not self.has_own_objective:
            return super()._compute_loss(model, inputs)  # TRL's cispo/sapo/vespo, warnings and metrics included
        return loss.policy_loss(self, model, inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        trl_forward = super()._get_per_token_logps_and_entropies
        if self._energy is None:
            return trl_forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        return self._energy.recorded(trl_forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        guard.check_grad_norm(self, grad_norm)
        return grad_norm

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:  # fmt: skip
        """The policy loss before masking and aggregation (default: TRL's clipped surrogate). With
        `objective_applies_loss_weights` it takes the keyword `loss_weights` too and returns the weighted loss."""
        return clipped_surrogate_loss(per_token_logps, old_per_token_logps, advantages, mask,
                                      epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
                                      importance_sampling_level=self.importance_sampling_level,
                                      delta=self.args.delta)  # fmt: skip

    def compute_advantages(self, inputs: dict[str, Any], per_token_logps: Tensor, mask: Tensor) -> Tensor:
        """(B,) or (B, T) advantages for this micro-batch from the config's estimator."""
        out = self.estimator.estimate(loss.estimator_inputs(self, inputs, mask), **self._estimator_knobs)
        if out.metrics:
            mode = "train" if self.model.training else "eval"
            self._metrics_queue.add(dict(out.metrics), out.metrics_mask, mode)
        return out.advantages

    # What a method's extra forward reuses (ECHO's step totals): the loss's forward and metric queue.
    def _forward_logps_and_entropies(self, model, inputs: dict[str, Any]):
        if self._energy is None:
            return loss.forward_logps_and_entropies(self, model, inputs)
        return self._energy.training_forward(lambda m, i: loss.forward_logps_and_entropies(self, m, i), model, inputs)

    def _metrics_discarded(self):
        return self._metrics_queue.discarded()

    def _flush_metrics(self) -> None:
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

    def mechanisms(self) -> tuple[Mechanism, ...]:
        """The mechanisms this run reports: its method's, and its advantage estimator's."""
        report = self._report_callback
        return report.tracker.mechanisms if report is not None else ()

    @property
    def mechanism_report(self) -> MechanismReport | None:
        """Whether the mechanisms acted, over the whole run so far (None for a class without a definition)."""
        report = self._report_callback
        return report.report() if report is not None else None

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
        # mirrors Trainer._save_checkpoint (transformers 5.24): the checkpoint folder's path
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            remove_checkpoint_record(folder)  # a re-save cut short must not pass for the earlier save
        with disk_full_explained(folder):
            super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # the completion record follows every process's part
        if self.args.should_save and os.path.isdir(folder):
            write_checkpoint_record(folder, run_record(self))

    def _issue_warnings_after_load(self, load_result) -> None:
        """transformers' warnings, less a tied weight reported missing (restored by the tie)."""
        # every caller in transformers 5.24 passes torch's `_IncompatibleKeys`, a named tuple
        load_result = load_result._replace(missing_keys=missing_keys_to_report(self.model, load_result.missing_keys))
        super()._issue_warnings_after_load(load_result)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        with tokens_withheld():
            super()._push_from_checkpoint(checkpoint_folder)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None, **kwargs):
        from .card import create_model_card

        create_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags, **kwargs)
