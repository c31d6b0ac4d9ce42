"""`GroupOptTrainer`: TRL's `GRPOTrainer` with the policy objective and the advantages as pluggable pure functions.
The loss reads top to bottom in `_compute_loss` (inputs -> advantages -> objective -> TRL's loss weights, KL,
aggregation, entropy bonus, aux loss, metrics); the other TRL hooks it wraps are in `boundary.TRLHooks`. With the
default objective and estimator it *is* TRL's GRPO/GSPO/DAPO (tests/trainers/test_base_parity.py). TRL upgrades:
docs/trl-upgrade.md."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor
from trl import GRPOConfig
from trl.trainer.utils import get_config_model_id

from ..core.common import ObjectiveOutput, clipped_surrogate_loss, log_importance_weights
from ..core.estimators import AdvantageEstimator, EstimatorInputs, estimator_of
from ..data import checks
from ..methods.mechanism import MechanismReport
from ..methods.registry import METHODS, spec_for
from ..methods.spec import MethodSpec
from ..runfolder.resume import method_name
from ..runfolder.run import OpenedRun, open_run
from .api_check import check_api_inputs
from .args_check import check_numeric_args
from .batching import EQUAL_REWARDS, zero_equal_reward_rows
from .boundary import TRLHooks, finished_run_output
from .compat import (
    check_loss_routed_through_compute_loss,
    check_trl_scores_tokens,
    dropping_trl_warning,
    stack_noise_hidden,
)
from .energy import EnergyCapture
from .guard import check_loss
from .loss import (
    SUPPORTED_LOSS_TYPES,
    TRL_SURROGATE_LOSS_TYPES,
    LossInputs,
    TokenMultipliers,
    aggregate,
    forward_arguments,
    k3_kl,
)
from .metrics import MetricsQueue
from .numerics import NoiseWarningCallback, clip_windows, rollout_noise_metrics
from .report import MechanismReportCallback
from .schedule import check_dataset_holds_a_generation_batch, warn_if_inert_on_policy

__all__ = ["GroupOptTrainer"]


class GroupOptTrainer(TRLHooks):
    """`GRPOTrainer` whose policy objective is a pure function (see the module docstring)."""

    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig  # where the knobs are
    #: The objective needs whole groups (and `group_ids`) in every micro-batch (or a function of the config).
    requires_whole_groups: ClassVar[bool | Callable[[Any], bool]] = False
    supports_delta: ClassVar[bool] = True  # whether TRL's `delta` (two-sided surrogate clip) means anything here
    #: What happens to the mechanism on-policy (then it warns), e.g. "ECHO's batch clip never acts"; None: it acts.
    inert_on_policy: ClassVar[str | None] = None
    #: Why a token's gradient also carries a batch-wide term (None: it does not); then the contract
    #: (`trl_groupopt.testing`) checks the sign of the whole gradient against the advantages, not each token's.
    gradient_couples_tokens: ClassVar[str | None] = None
    #: The objective applies the token weights itself: the product of TRL's per-token multipliers (keyword
    #: `token_weights`, None when all are off); else the trainer multiplies its per-token loss by them.
    objective_applies_token_weights: ClassVar[bool] = False
    #: Changes TRL's loss or advantages (derived per subclass): only a class without may run TRL's cispo/sapo/vespo.
    has_own_objective: ClassVar[bool] = False
    #: (text of a misleading TRL construction warning, the line logged in its place, formatted with `args`).
    replaces_trl_warning: ClassVar[tuple[str, str] | None] = None
    #: Set by the `trl-groupopt` command: the run it opened before the model loaded, which `train()` takes (once).
    opened_run: OpenedRun | None = None
    heldout_accuracy: dict[str, Any] | None = None  # {"before", "after", "num_examples"} when measured (the card)
    resumed_from: str | None = None  # the checkpoint `train()` resumed from
    finished: str | None = None  # after `train()`: the line saying the run was at its last step (nothing trained)

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
        check_loss_routed_through_compute_loss(type(self))
        check_trl_scores_tokens()  # trl 1.15.0 without Triton (CPU builds of torch) has no log-prob kernel
        # Reward functions come back wrapped so a non-number fails with their name.
        reward_funcs = checks.prepare_trainer_inputs(reward_funcs, train_dataset, environment_factory)
        check_api_inputs(model, reward_funcs, args, train_dataset, environment_factory)  # before the model loads
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
        self._estimator_knobs = {knob: getattr(self.args, knob) for knob in self.estimator.knobs}  # config fields
        if self.estimator.needs_energy:
            self._energy = EnergyCapture(self)  # after TRL's `__init__`, which patched the LM head
        self.whole_groups = self.needs_whole_groups(self.args)
        check_dataset_holds_a_generation_batch(self.args, self.train_dataset)
        warn_if_inert_on_policy(type(self).__name__, self.args, self.inert_on_policy)
        spec = self.method_spec
        self.add_callback(MechanismReportCallback(spec.name if spec is not None else None, self.estimator.name))
        self.add_callback(NoiseWarningCallback(type(self).__name__, clip_windows(self.args)))

    @property
    def method_spec(self) -> MethodSpec | None:
        """The registered method this trainer's class trains (`spec_for`), None for a class that is none."""
        return spec_for(type(self))

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
        owner = next((spec.trainer_class for spec in METHODS.values() if type(args) is spec.config_class), cls)
        if not issubclass(cls, owner) and owner.objective is not cls.objective:  # issue 52: trained under its name
            raise ValueError(
                f"{cls.__name__} was given {type(args).__name__}(...), whose method it would not train (its own "
                f"objective instead, under that config's options): use {owner.__name__}(args=...), or {cls.__name__} "
                f"with a {cls.config_class.__name__}."
            )
        estimator = estimator_of(args)
        trl_loss = args.loss_type in TRL_SURROGATE_LOSS_TYPES
        if args.loss_type not in SUPPORTED_LOSS_TYPES and not (
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
                f"Use one of {SUPPORTED_LOSS_TYPES}."
            )
        if args.delta is not None and not cls.supports_delta:
            raise ValueError(f"delta={args.delta} has no meaning for {cls.__name__}'s objective; leave delta=None.")
        batch_size, groups = args.per_device_train_batch_size, args.num_generations  # TRL's config: groups >= 2
        if cls.needs_whole_groups(args) and batch_size % groups != 0:
            raise ValueError(
                f"{cls.__name__} needs whole groups in every micro-batch: per_device_train_batch_size "
                f"({batch_size}) must be a multiple of num_generations ({groups}). Use per_device_train_batch_size "
                f"in {[groups * k for k in range(1, 5)]}, or a num_generations that divides {batch_size}."
            )

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """transformers' `train` in the opened run (`trl_groupopt.runfolder.run.open_run`: the lock held, the resume
        rules decided, once per run): the one the command line opened before the model loaded (`opened_run`, which
        then decides the checkpoint), else one opened here (the Python API). The mechanism report prints at the end."""
        opened, self.opened_run = self.opened_run, None  # a later `train()` opens its own
        if opened is not None:
            return self._train_opened(opened, trial, ignore_keys_for_eval, **kwargs)
        with open_run(self.args, method_name(self), resume_from_checkpoint) as opened:
            return self._train_opened(opened, trial, ignore_keys_for_eval, **kwargs)

    def _train_opened(self, opened: OpenedRun, trial, ignore_keys_for_eval, **kwargs):
        self.resumed_from, self.finished = opened.checkpoint, opened.done
        if opened.done is not None:  # at its last step: nothing trains, nothing changes (`resume.decide`)
            if not opened.cli:
                warnings.warn(opened.done, UserWarning, stacklevel=3)
            return finished_run_output(self, opened.checkpoint)
        opened.begin()
        with stack_noise_hidden():  # TRL 1.16's deprecated calls into transformers 5: nothing a user can change
            return super().train(
                resume_from_checkpoint=opened.checkpoint,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
                **kwargs,
            )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # TRL's: `_compute_loss`
        check_loss(self, model, loss)  # the non-finite guard, before the backward pass
        return loss

    def _compute_loss(self, model, inputs):
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): its steps, terms and metric names in TRL's order; only the
        # advantages (`compute_advantages`) and the surrogate (`objective`) are pluggable
        if self.loss_type in TRL_SURROGATE_LOSS_TYPES and not self.has_own_objective:
            return super()._compute_loss(model, inputs)  # TRL's cispo/sapo/vespo, warnings and metrics included
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accumulation in eval
        batch = self.loss_inputs(model, inputs)  # the forward, mask, old log-probs, advantages, TRL's loss weights
        logps, old_logps, _, mask = batch.objective_args  # (B, T) each
        noise = rollout_noise_metrics(self, logps, inputs, mask)  # the forward's noise, on a rollout's first step
        if self.objective_applies_token_weights:
            out = self.objective(*batch.objective_args, inputs, token_weights=batch.multipliers.product())
            per_token_loss = out.per_token_loss  # (B, T) or (B, 1)
        else:
            out = self.objective(*batch.objective_args, inputs)
            per_token_loss = batch.multipliers.apply(out.per_token_loss)  # (B, T) or (B, 1)
        shared = {"entropy": batch.entropies}  # (B, T) metrics every objective logs
        if self.beta != 0.0:
            per_token_kl = k3_kl(logps, inputs["ref_per_token_logps"])  # (B, T)
            if self.args.use_bias_correction_kl:  # times the importance weight, as the default objective's
                log_weights = log_importance_weights(logps - old_logps, mask, self.importance_sampling_level)
                per_token_kl = per_token_kl * torch.exp(log_weights)  # (B, T)
            per_token_loss = per_token_loss + self.beta * per_token_kl  # (B, T)
            shared["kl"] = per_token_kl
        normalizer = None
        if self.loss_type == "dapo":  # the generation batch's token count, rescaled to one window on one process
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes  # ()
            if mode == "train":
                normalizer = normalizer * accumulation / self.args.steps_per_generation
        loss, policy_loss = aggregate(  # (), ()
            per_token_loss, mask, self.loss_type, accumulation, self.max_completion_length, normalizer
        )
        if self._entropy_bonus_enabled:
            effective_mask = mask if batch.multipliers.entropy_mask is None else mask * batch.multipliers.entropy_mask
            loss = loss - self._entropy_bonus(batch.entropies, effective_mask, mode, accumulation)  # ()
            shared["policy_loss"] = policy_loss  # () averaged over processes, as TRL's gather().nanmean()
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * batch.aux_loss / accumulation  # ()
            shared["aux_loss"] = batch.aux_loss.detach()  # () averaged over processes
        self._metrics_queue.add({**out.metrics, **shared, **noise}, mask, mode)
        self._flush_metrics()  # this micro-batch's metrics (and any a hook queued): one collective, one sync
        return loss

    def loss_inputs(self, model, inputs: dict[str, Any]) -> LossInputs:
        """The loss's forward and what the objective reads (ECHO's step totals run it too)."""
        return self.compute_loss_inputs(inputs, *self._forward_logps_and_entropies(model, inputs))

    def compute_loss_inputs(self, inputs: dict[str, Any], per_token_logps: Tensor, entropies: Tensor | None,
                            aux_loss: Tensor | None = None) -> LossInputs:  # fmt: skip
        """What the objective reads of `inputs` at these (B, T) log-probs and entropies (the loss forward's in
        `loss_inputs`; `entropies` may be None where the entropy mask is off): the loss mask, the old log-probs, the
        advantages, which runs the estimator and queues its metrics (`compute_advantages`), and TRL's multipliers."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): `mask` less tool results, old log-probs, and the
        # off-policy mask, entropy mask and vLLM IS blocks
        mask = inputs["completion_mask"]  # (B, T)
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]  # (B, T) no loss on tool results
        old_per_token_logps = inputs.get("old_per_token_logps")  # (B, T)
        if old_per_token_logps is None:  # on-policy TRL skips the behaviour forward: the ratio is exactly 1
            old_per_token_logps = per_token_logps.detach()
        advantages = self.compute_advantages(inputs, per_token_logps, mask)  # (B,) or (B, T)
        off_policy_mask = entropy_mask = importance_weights = None
        if self.off_policy_mask_threshold is not None:
            off_policy_mask = self.get_off_policy_mask(  # (B, 1)
                advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,  # (B, 1) or (B, T)
                per_token_logps=per_token_logps, mask=mask, off_policy_threshold=self.off_policy_mask_threshold,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_per_token_logps),
            )  # fmt: skip
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)  # (B, T)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            importance_weights = inputs["importance_sampling_ratio"]  # (B, T) or (B, 1)
        multipliers = TokenMultipliers(off_policy_mask, entropy_mask, importance_weights)
        return LossInputs(per_token_logps, old_per_token_logps, advantages, mask, multipliers, entropies, aux_loss)

    def _forward_logps_and_entropies(self, model, inputs: dict[str, Any]):
        """(log-probs, entropies, aux loss) of the completion tokens: TRL's loss forward (with the energy capture)."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): its `_get_per_token_logps_and_entropies` call
        arguments, keywords = forward_arguments(inputs, aux_loss=self.aux_loss_enabled)
        forward = functools.partial(self._get_per_token_logps_and_entropies, model, *arguments, **keywords)
        return forward() if self._energy is None else self._energy.training_forward(forward, inputs)

    def _entropy_bonus(self, entropies: Tensor, effective_mask: Tensor, mode: str, accumulation: float) -> Tensor:
        """coef * mean token entropy, TRL's static or adaptive entropy bonus (to be subtracted from the loss)."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `_entropy_bonus_enabled` block and adaptive controller
        entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation  # ()
        # The coefficient from the end of the previous optimizer step: every micro-batch of a window applies the same.
        apply_coef = self.entropy_coef
        if self.use_adaptive_entropy and self._last_world_entropy > self.args.entropy_target:
            apply_coef = 0.0
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()  # (2,)
            previous = self._entropy_window_stats
            self._entropy_window_stats = stats if previous is None else previous + stats
            if self.accelerator.sync_gradients:  # an optimizer-step boundary: update the coefficient
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")  # (2,)
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                args = self.args
                if world_entropy <= args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self.log_step_metric("entropy_coef", self.entropy_coef)
        return apply_coef * entropy_loss

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:  # fmt: skip
        """The policy loss before masking and aggregation (default: TRL's clipped surrogate). With
        `objective_applies_token_weights` it takes the keyword `token_weights` too and returns the weighted loss."""
        return clipped_surrogate_loss(per_token_logps, old_per_token_logps, advantages, mask,
                                      epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
                                      importance_sampling_level=self.importance_sampling_level,
                                      delta=self.args.delta)  # fmt: skip

    def compute_advantages(self, inputs: dict[str, Any], per_token_logps: Tensor, mask: Tensor) -> Tensor:
        """(B,) or (B, T) advantages for this micro-batch: the config's estimator, on TRL's advantages after the
        equal-reward rule (a method's group whose rewards are all equal gets advantage 0: `batching.EQUAL_REWARDS`).
        Every change to the advantages happens here; the estimator's metrics are queued."""
        trl_advantages = zero_equal_reward_rows(inputs.get("advantages"), inputs.get(EQUAL_REWARDS))  # (B,)
        out = self.estimator.estimate(self._estimator_inputs(inputs, mask, trl_advantages), **self._estimator_knobs)
        if out.metrics:
            mode = "train" if self.model.training else "eval"
            self._metrics_queue.add(dict(out.metrics), out.metrics_mask, mode)
        return out.advantages

    def _estimator_inputs(self, inputs: dict[str, Any], mask: Tensor, trl_advantages: Tensor) -> EstimatorInputs:
        estimator = self.estimator
        energy = self._energy.rollout_energy(inputs) if estimator.needs_energy else None  # (B, T)
        weights = inputs.get("importance_sampling_ratio")  # vLLM IS ratio: (B, T) or (B, 1)
        if weights is not None:
            weights = weights.expand_as(mask).to(energy.dtype if energy is not None else weights.dtype)  # (B, T)
        rewards = inputs["rewards"] if estimator.needs_raw_rewards else None  # (B,)
        return EstimatorInputs(mask=mask, trl_advantages=trl_advantages, rewards=rewards, energy=energy,
                               group_size=self.group_size, importance_weights=weights,
                               tool_use="tool_mask" in inputs)  # fmt: skip

    def _metrics_discarded(self):
        """Within it, metrics queued are dropped (a forward that only prepares the loss, e.g. ECHO's step totals)."""
        return self._metrics_queue.discarded()

    @property
    def mechanism_report(self) -> MechanismReport | None:
        """Whether the mechanisms this run reports (its method's and its advantage estimator's) acted, over the whole
        run so far (None for a class without a definition)."""
        report = self._report_callback
        return report.report() if report is not None and report.tracker.mechanisms else None

    @property
    def no_signal_steps(self) -> tuple[int, int] | None:
        """(optimizer steps without a learning signal, optimizer steps) over the whole run so far; None before any
        (trl_groupopt/trainer/learning_signal.py)."""
        report = self._report_callback
        return report.signal.counts if report is not None else None

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None, **kwargs):
        from .card import create_model_card

        create_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags, **kwargs)
