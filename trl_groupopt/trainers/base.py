"""`GroupOptTrainer`: TRL's `GRPOTrainer` with the policy objective as a pluggable pure function.

It is assembled from one mixin per concern; this module holds the shell: the method hooks (`objective`,
`compute_advantages`), the class flags a method sets, construction (validation and guards) and saving.

- `loss.py`: one `_compute_loss` for every method, with TRL 1.16's extras and `loss_type` aggregation;
- `batching.py`: whole-group micro-batches with `group_ids`, the raw rewards, the all-None reward watch;
- `metrics.py`: the objective's metrics reduced over processes as TRL does, in one collective per micro-batch;
- `energy.py`: the logit-gradient energy from TRL's fused head, on only for estimators that need it (OTB's);
- `schedule.py`: the on-policy warning and the dataset-size check; `compat.py`: the Unsloth/Liger guard;
- `report.py`: whether the method's mechanism acted (`acted/<method>` per step, `mechanism_report`, `train()`'s report);
- `guard.py`: a NaN/inf loss or gradient norm stops training before it is applied, saved or pushed;
- `checkpointing.py`: resume from complete checkpoints only, completion records, the output folder's lock.

The advantages the objective receives come from the config's `advantage_estimator` (`"grpo"`, TRL's own, when the
config has no such field, e.g. TRL's `GRPOConfig`): one registry of estimators, `trl_groupopt/objectives/estimators.py`,
serves every method, and what an estimator needs (raw rewards, whole groups, the energy) is switched on here for it
alone.

With the default objective (TRL's clipped surrogate) and estimator this trainer *is* TRL's GRPO/GSPO/DAPO: the parity
tests compare loss and gradients against `GRPOTrainer._compute_loss`. For TRL's surrogate-replacing loss types (cispo,
sapo, vespo) the base trainer calls `GRPOTrainer._compute_loss` itself; a trainer with its own objective, or a config
whose estimator is not TRL's, rejects them at construction (`validate_args`).

The constructor takes exactly `GRPOTrainer.__init__`'s arguments with its defaults (`reward_funcs=None`,
`environment_factory`, `tools`, `rollout_func`, ...): rewards may come from the environment (`get_reward`), and with
no reward source at all TRL raises its own "No reward source provided" error.

TRL upgrade checklist: every block that mirrors TRL code carries a `# mirrors GRPOTrainer.<method> (trl 1.16.0)`
comment (here and in the mixins' modules); re-read those TRL methods and run `tests/trainers/test_base_parity.py`
and `tests/trainers/test_dropin.py`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..checks import prepare_trainer_inputs
from ..methods import grpo
from ..objectives.common import ObjectiveOutput, clipped_surrogate_loss
from ..objectives.estimators import AdvantageEstimator, EstimatorInputs, estimator_of
from ..resume import disk_full_explained
from ..spec import MethodSpec, Paper
from .args_check import check_numeric_args
from .batching import GroupBatchingMixin
from .checkpointing import RunFolderMixin
from .compat import check_loss_routed_through_compute_loss
from .config import estimator_knobs, tokens_withheld
from .energy import EnergyCaptureMixin
from .guard import NonFiniteGuardMixin
from .loss import SUPPORTED_LOSS_TYPES, TRL_SURROGATE_LOSS_TYPES, LossMixin
from .metrics import MetricsMixin
from .report import MechanismReportMixin
from .schedule import check_dataset_holds_a_generation_batch, warn_if_inert_on_policy

__all__ = ["GroupOptTrainer"]


def _is_passthrough(function: Callable) -> bool:
    """Whether `function` has the signature `(self, *args, **kwargs)`."""
    kinds = [param.kind for param in inspect.signature(function).parameters.values()]
    return kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL,
                     inspect.Parameter.VAR_KEYWORD]  # fmt: skip


def _card_metadata(spec: MethodSpec) -> tuple[str, list[str], dict[str, str | None]]:
    """TRL's `_name`, `_tag_names` and `_paper` (its model card's inputs) for a method's spec."""
    paper = spec.paper.trl_fields() if isinstance(spec.paper, Paper) else {"title": str(spec.paper)}
    return spec.display_name, ["trl", spec.name, "trl-groupopt"], paper


class GroupOptTrainer(
    EnergyCaptureMixin,
    LossMixin,
    GroupBatchingMixin,
    MetricsMixin,
    MechanismReportMixin,
    NonFiniteGuardMixin,
    RunFolderMixin,
    GRPOTrainer,
):
    """`GRPOTrainer` whose policy objective is a pure function (see module docstring).

    Subclasses set `method_spec` (their entry in `trl_groupopt/methods/`, from which TRL's model-card metadata
    `_name`, `_tag_names` and `_paper` follow), `config_class`, `objective` and the class flags below; the
    advantages come from the config's estimator (`self.estimator`). The base class itself trains TRL's
    GRPO/GSPO/DAPO objective.
    """

    #: The method this trainer implements (its paper, name and tags for model cards).
    method_spec: ClassVar[MethodSpec] = grpo.METHOD
    _name, _tag_names, _paper = _card_metadata(grpo.METHOD)

    #: The config class this trainer reads its knobs from (a `GRPOConfig` subclass).
    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig
    #: The objective needs every micro-batch to hold whole groups, with a `group_ids` tensor (DFPO). An advantage
    #: estimator declares its own needs (`AdvantageEstimator.needs_whole_groups`, `needs_raw_rewards`).
    requires_whole_groups: ClassVar[bool] = False
    #: Whether TRL's `delta` (two-sided clip of the surrogate) has a meaning for this objective.
    supports_delta: ClassVar[bool] = True
    #: What happens to this method's mechanism on an on-policy schedule, e.g. "ECHO's batch clip never acts" (the
    #: trainer then warns, naming the fix; see `schedule.py`); None: the mechanism acts on-policy too.
    inert_on_policy: ClassVar[str | None] = None
    #: The objective applies TRL's per-token loss weights itself (the product of the off-policy mask, the entropy mask
    #: and the vLLM IS weights, passed as the keyword `loss_weights`, None when all are off); `_compute_loss` then
    #: does not multiply them again. ECHO needs them in its batch-ratio coupling, DFPO in its in-group transform.
    objective_applies_loss_weights: ClassVar[bool] = False
    #: Whether this class changes TRL's policy loss or advantages (overrides `objective` or `compute_advantages`, or
    #: its config class selects another estimator by default, as OTB's). Derived per subclass unless set explicitly.
    #: Only a class without its own objective, with a config whose estimator is TRL's, is TRL's GRPO and may hand
    #: TRL's surrogate-replacing loss types (cispo, sapo, vespo) to `GRPOTrainer._compute_loss`.
    has_own_objective: ClassVar[bool] = False
    #: Held-out accuracy of the run, when measured: `{"before": float, "after": float, "num_examples": int}` (set by
    #: the CLI and the notebook; the model card states it).
    heldout_accuracy: dict[str, Any] | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "method_spec" in cls.__dict__:  # TRL's card metadata from the spec, unless the class sets its own
            for attribute, value in zip(("_name", "_tag_names", "_paper"), _card_metadata(cls.method_spec)):
                if attribute not in cls.__dict__:
                    setattr(cls, attribute, value)
        if "has_own_objective" not in cls.__dict__:
            cls.has_own_objective = (
                cls.objective is not GroupOptTrainer.objective
                or cls.compute_advantages is not GroupOptTrainer.compute_advantages
                or not estimator_of(cls.config_class).trl_advantages  # the config class's default estimator
            )
        # A subclass `__init__(self, *args, **kwargs)` forwards everything here: show GRPOTrainer's signature for it
        # (help(), IDEs and `inspect.signature` then list the same parameters as for GRPOTrainer).
        init = cls.__init__  # its own, or a mixin's before GroupOptTrainer
        if init is not GroupOptTrainer.__init__ and _is_passthrough(init):
            init.__signature__ = inspect.signature(GroupOptTrainer.__init__)

    # mirrors GRPOTrainer.__init__ (trl 1.16.0): the same parameters, order and defaults, so any GRPOTrainer call works
    def __init__(
        self,
        model,
        reward_funcs: Any | list[Any] | None = None,
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config=None,
        peft_config=None,
        tools: list[Callable] | None = None,
        rollout_func: Callable | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
    ):
        if args is None:  # mirrors GRPOTrainer.__init__ (trl 1.16.0), with this method's config and run name
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = self.config_class(f"{model_name.split('/')[-1]}-{self._name.split()[0]}")
        self.validate_args(args)
        check_loss_routed_through_compute_loss(type(self), bool(args is not None and args.use_liger_kernel))
        # Data/reward checks at the door; reward functions come back wrapped so a non-number fails with their name.
        reward_funcs = prepare_trainer_inputs(reward_funcs, train_dataset, environment_factory)
        super().__init__(
            model,
            reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        #: The advantage estimator (`advantage_estimator`; TRL's own for a config without the field).
        self.estimator: AdvantageEstimator = estimator_of(self.args)
        self._estimator_knobs = estimator_knobs(self.args, self.estimator)
        if self.estimator.needs_energy:
            self._enable_energy_capture()
        self.whole_groups = self.needs_whole_groups(self.args)
        check_dataset_holds_a_generation_batch(self.args, self.train_dataset)
        warn_if_inert_on_policy(type(self).__name__, self.args, self.inert_on_policy)
        self._start_mechanism_report()

    @classmethod
    def needs_whole_groups(cls, args: GRPOConfig) -> bool:
        """Whether this configuration couples the sequences of a group (then micro-batches hold whole groups): the
        objective's `requires_whole_groups`, or the estimator's."""
        return cls.requires_whole_groups or estimator_of(args).needs_whole_groups

    @property
    def group_size(self) -> int:
        """Rows per group: a whole-group micro-batch is consecutive runs of this many (TRL's sampler order)."""
        return self.num_generations if self.model.training else self.num_generations_eval

    # ------------------------------------------------------------------ validation
    @classmethod
    def validate_args(cls, args: GRPOConfig) -> None:
        """Raise a `ValueError` that names the fix for every config this trainer cannot honour."""
        if not isinstance(args, cls.config_class):
            raise ValueError(
                f"{cls.__name__} reads its settings from a {cls.config_class.__name__}, got a {type(args).__name__}: "
                f"build the config with {cls.config_class.__name__}(...) (it accepts every GRPOConfig argument)."
            )
        check_numeric_args(cls.__name__, args)  # num_iterations, beta, max_grad_norm, ... (args_check.py)
        estimator = estimator_of(args)
        trl_loss = args.loss_type in TRL_SURROGATE_LOSS_TYPES
        if trl_loss and not cls.has_own_objective and estimator.trl_advantages:
            pass  # TRL's own `_compute_loss` computes it (see `LossMixin._compute_loss`)
        elif args.loss_type not in SUPPORTED_LOSS_TYPES:
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
        if cls.needs_whole_groups(args):
            cls._validate_whole_groups(args)

    @classmethod
    def _validate_whole_groups(cls, args: GRPOConfig) -> None:
        num_generations = args.num_generations
        if num_generations is None or num_generations < 2:
            raise ValueError(
                f"{cls.__name__} compares the completions of a group: num_generations must be >= 2, got {num_generations}."
            )
        batch_size = args.per_device_train_batch_size
        if batch_size % num_generations != 0:
            working = [num_generations * k for k in range(1, 5)]
            raise ValueError(
                f"{cls.__name__} needs whole groups in every micro-batch: per_device_train_batch_size "
                f"({batch_size}) must be a multiple of num_generations ({num_generations}). "
                f"Use per_device_train_batch_size in {working}, or a num_generations that divides {batch_size}."
            )

    # ------------------------------------------------------------------ model card and save
    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None, **kwargs):
        """TRL's card plus the method's knobs and the reward-curve summary (see `trl_groupopt.model_card`)."""
        from ..model_card import create_model_card

        create_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """transformers' `_save` (its `training_args.bin` without the token; weights checked finite, `guard.py`), then
        our card in the saved folder (replacing PEFT's empty template for adapters)."""
        with tokens_withheld(), disk_full_explained(output_dir or self.args.output_dir):
            super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            self.create_model_card(output_dir=output_dir if output_dir is not None else self.args.output_dir)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """transformers' checkpoint push; the `training_args.bin` it writes before uploading holds no token."""
        with tokens_withheld():
            super()._push_from_checkpoint(checkpoint_folder)

    def _generate_and_score_completions(self, inputs):
        """TRL's, plus the batch fields the objective and estimator need (`group_ids`, raw `rewards`; `batching.py`)."""
        self._raw_rewards_per_func = None  # filled by `_calculate_rewards` during TRL's call
        return self._add_batch_fields(super()._generate_and_score_completions(inputs), inputs)

    # ------------------------------------------------------------------ the method's hooks
    def objective(
        self,
        per_token_logps: Tensor,
        old_per_token_logps: Tensor,
        advantages: Tensor,
        mask: Tensor,
        inputs: dict[str, Any],
    ) -> ObjectiveOutput:
        """The policy loss before masking and aggregation. Default: TRL's clipped surrogate (GRPO/GSPO).

        A class with `objective_applies_loss_weights` takes the keyword `loss_weights` too and returns the weighted
        loss."""
        return clipped_surrogate_loss(
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            importance_sampling_level=self.importance_sampling_level,
            delta=self.args.delta,
        )

    def compute_advantages(self, inputs: dict[str, Any], per_token_logps: Tensor, mask: Tensor) -> Tensor:
        """(B,) or (B, T) advantages for this micro-batch: the config's estimator's (TRL's group-relative advantages
        for `"grpo"`), whose metrics are queued for this micro-batch's log."""
        estimator = self.estimator
        out = estimator.estimate(self._estimator_inputs(inputs, mask), **self._estimator_knobs)
        if out.metrics:
            self._log_objective_metrics(
                dict(out.metrics), out.metrics_mask, "train" if self.model.training else "eval"
            )
        return out.advantages

    def _estimator_inputs(self, inputs: dict[str, Any], mask: Tensor) -> EstimatorInputs:
        """What the estimator reads from the batch and the trainer: only the fields it declares a need for."""
        estimator = self.estimator
        energy = self.rollout_energy(inputs) if estimator.needs_energy else None  # (B, T)
        weights = inputs.get("importance_sampling_ratio")  # vLLM IS ratio: (B, T) or (B, 1)
        if weights is not None:
            weights = weights.expand_as(mask).to(energy.dtype if energy is not None else weights.dtype)  # (B, T)
        return EstimatorInputs(
            trl_advantages=inputs.get("advantages"),
            mask=mask,
            rewards=inputs["rewards"] if estimator.needs_raw_rewards else None,
            group_ids=inputs.get("group_ids"),
            group_size=self.group_size,
            energy=energy,
            importance_weights=weights,
            tool_use="tool_mask" in inputs,
        )
