"""`GroupOptTrainer`: TRL's `GRPOTrainer` with the policy objective as a pluggable pure function.

It is assembled from one mixin per concern; this module holds the shell: the method hooks (`objective`,
`compute_advantages`), the class flags a method sets, construction (validation and guards) and saving.

- `loss.py`: one `_compute_loss` for every method, with TRL 1.16's extras and `loss_type` aggregation;
- `batching.py`: whole-group micro-batches with `group_ids`, the raw rewards, the all-None reward watch;
- `metrics.py`: the objective's metrics reduced over processes as TRL does, in one collective per micro-batch;
- `schedule.py`: the on-policy warning and the dataset-size check; `compat.py`: the Unsloth/Liger guard;
- `guard.py`: a NaN/inf loss or gradient norm stops training before it is applied, saved or pushed;
- `checkpointing.py`: resume from complete checkpoints only, completion records, the output folder's lock.

With the default objective (TRL's clipped surrogate) this trainer *is* TRL's GRPO/GSPO/DAPO: the parity tests
compare loss and gradients against `GRPOTrainer._compute_loss`. For TRL's surrogate-replacing loss types (cispo, sapo,
vespo) the base trainer calls `GRPOTrainer._compute_loss` itself; method trainers, which have their own objective,
reject them at construction.

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
from ..spec import MethodSpec, Paper
from .batching import GroupBatchingMixin
from .checkpointing import RunFolderMixin
from .compat import check_loss_routed_through_compute_loss
from .config import tokens_withheld
from .guard import NonFiniteGuardMixin
from .loss import SUPPORTED_LOSS_TYPES, TRL_SURROGATE_LOSS_TYPES, LossMixin
from .metrics import MetricsMixin
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


class GroupOptTrainer(LossMixin, GroupBatchingMixin, MetricsMixin, NonFiniteGuardMixin, RunFolderMixin, GRPOTrainer):
    """`GRPOTrainer` whose policy objective is a pure function (see module docstring).

    Subclasses set `method_spec` (their entry in `trl_groupopt/methods/`, from which TRL's model-card metadata
    `_name`, `_tag_names` and `_paper` follow), `config_class`, `objective` (and, for advantage-transforming methods,
    `compute_advantages`) and the class flags below. The base class itself trains TRL's GRPO/GSPO/DAPO objective.
    """

    #: The method this trainer implements (its paper, name and tags for model cards).
    method_spec: ClassVar[MethodSpec] = grpo.METHOD
    _name, _tag_names, _paper = _card_metadata(grpo.METHOD)

    #: The config class this trainer reads its knobs from (a `GRPOConfig` subclass).
    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig
    #: Every micro-batch must hold whole groups, with a `group_ids` tensor (DFPO, OTB).
    requires_whole_groups: ClassVar[bool] = False
    #: The batch must carry the raw (weighted, un-normalised) rewards as `rewards` (OTB).
    requires_raw_rewards: ClassVar[bool] = False
    #: Whether TRL's `delta` (two-sided clip of the surrogate) has a meaning for this objective.
    supports_delta: ClassVar[bool] = True
    #: What happens to this method's mechanism on an on-policy schedule, e.g. "ECHO's batch clip never acts" (the
    #: trainer then warns, naming the fix; see `schedule.py`); None: the mechanism acts on-policy too.
    inert_on_policy: ClassVar[str | None] = None
    #: The objective applies TRL's per-token loss weights itself (the product of the off-policy mask, the entropy mask
    #: and the vLLM IS weights, passed as the keyword `loss_weights`, None when all are off); `_compute_loss` then
    #: does not multiply them again. ECHO needs them in its batch-ratio coupling, DFPO in its in-group transform.
    objective_applies_loss_weights: ClassVar[bool] = False
    #: Whether this class changes TRL's policy loss or advantages (overrides `objective` or `compute_advantages`).
    #: Derived per subclass unless set explicitly. Only a class without its own objective is TRL's GRPO and may hand
    #: TRL's surrogate-replacing loss types (cispo, sapo, vespo) to `GRPOTrainer._compute_loss`.
    has_own_objective: ClassVar[bool] = False

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
            )
        # A subclass `__init__(self, *args, **kwargs)` forwards everything here: show GRPOTrainer's signature for it
        # (help(), IDEs and `inspect.signature` then list the same parameters as for GRPOTrainer).
        init = cls.__init__  # its own, or a mixin's before GroupOptTrainer (e.g. EnergyCaptureMixin's)
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
        self.whole_groups = self.needs_whole_groups(self.args)
        check_dataset_holds_a_generation_batch(self.args, self.train_dataset)
        warn_if_inert_on_policy(type(self).__name__, self.args, self.inert_on_policy)

    @classmethod
    def needs_whole_groups(cls, args: GRPOConfig) -> bool:
        """Whether this configuration couples the sequences of a group (then micro-batches hold whole groups)."""
        return cls.requires_whole_groups

    # ------------------------------------------------------------------ validation
    @classmethod
    def validate_args(cls, args: GRPOConfig) -> None:
        """Raise a `ValueError` that names the fix for every config this trainer cannot honour."""
        if not isinstance(args, cls.config_class):
            raise ValueError(
                f"{cls.__name__} reads its settings from a {cls.config_class.__name__}, got a {type(args).__name__}: "
                f"build the config with {cls.config_class.__name__}(...) (it accepts every GRPOConfig argument)."
            )
        if args.loss_type in TRL_SURROGATE_LOSS_TYPES and not cls.has_own_objective:
            pass  # TRL's own `_compute_loss` computes it (see `LossMixin._compute_loss`)
        elif args.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={args.loss_type!r} is not supported by {cls.__name__}: TRL's cispo/sapo/vespo replace the "
                f"policy surrogate itself (GroupOptTrainer with a GRPOConfig runs them with TRL's own loss). "
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
        with tokens_withheld():
            super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            self.create_model_card(output_dir=output_dir if output_dir is not None else self.args.output_dir)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """transformers' checkpoint push; the `training_args.bin` it writes before uploading holds no token."""
        with tokens_withheld():
            super()._push_from_checkpoint(checkpoint_folder)

    def _generate_and_score_completions(self, inputs):
        """TRL's, plus the batch fields the objective needs (`group_ids`, raw `rewards`; see `batching.py`)."""
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
        """(B,) or (B, T) advantages for this micro-batch. Default: TRL's group-relative advantages."""
        return inputs["advantages"]
