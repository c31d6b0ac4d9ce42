"""`GroupOptTrainer`: TRL's `GRPOTrainer` with the policy objective as a pluggable pure function.

One override of `_compute_loss` serves every method. It

1. gets log-probs and entropies through TRL's own `_get_per_token_logps_and_entropies` (fused, tiled LM head),
2. asks the method for its advantages (`compute_advantages`, identity except for OTB) and its per-token loss
   (`objective`, a pure function from `trl_groupopt.objectives`),
3. applies TRL 1.16's shared extras with TRL's semantics: off-policy sequence mask, high-entropy token mask,
   vLLM importance-sampling correction, beta-KL (with `use_bias_correction_kl`), entropy bonus (static or
   adaptive), MoE load-balancing loss,
4. aggregates with `loss_type` exactly as TRL does (grpo, bnpo, dr_grpo, dapo, luspo, with TRL's
   gradient-accumulation scaling), and logs TRL's metric names plus the objective's own metrics.

With the default objective (TRL's clipped surrogate) this trainer *is* TRL's GRPO/GSPO/DAPO: the parity tests
compare loss and gradients against `GRPOTrainer._compute_loss`. For TRL's surrogate-replacing loss types (cispo, sapo,
vespo) the base trainer calls `GRPOTrainer._compute_loss` itself; method trainers, which have their own objective,
reject them at construction.

The constructor takes exactly `GRPOTrainer.__init__`'s arguments with its defaults (`reward_funcs=None`,
`environment_factory`, `tools`, `rollout_func`, ...): rewards may come from the environment (`get_reward`), and with
no reward source at all TRL raises its own "No reward source provided" error.

TRL upgrade checklist: every block that mirrors TRL code carries a `# mirrors GRPOTrainer.<method> (trl 1.16.0)`
comment; re-read those TRL methods and run `tests/trainers/test_base_parity.py` and `tests/trainers/test_dropin.py`.

Methods that couple the sequences of a group (DFPO, OTB) set `requires_whole_groups = True`: every micro-batch
then holds whole groups (TRL's row shuffle of the generation batch is replaced by a shuffle of whole groups) and
carries an explicit `group_ids` tensor, so no objective infers groups from positions.
"""

from __future__ import annotations

import inspect
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import (
    get_config_model_id,
    split_pixel_values_by_grid,
    split_tensor_dict,
    unsplit_pixel_values_by_grid,
)

from ..checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES, prepare_trainer_inputs, watch_all_none_rewards
from ..objectives.common import ObjectiveOutput, clipped_surrogate_loss, log_importance_weights
from ..registry import register_method
from .schedule import check_dataset_holds_a_generation_batch

# The loss types whose aggregation `_compute_loss` reproduces. TRL's cispo/sapo/vespo replace the surrogate itself,
# so they cannot be combined with another objective: the base trainer hands them to TRL's own `_compute_loss`.
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
TRL_SURROGATE_LOSS_TYPES = ("cispo", "sapo", "vespo")
_CLIP_METRICS = ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region")


def group_ids_for_local_batch(num_rows: int, num_generations: int, process_index: int, device=None) -> Tensor:
    """(num_rows,) global group index of each local row.

    TRL's `RepeatSampler` yields each prompt `num_generations` times in a row, and each process receives a
    contiguous slice of `num_rows` rows of the global generation batch (`process_slice` in
    `_generate_and_score_completions`), so the global row index divided by `num_generations` names the group.
    """
    # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): `process_slice` of the gathered batch
    if num_rows % num_generations != 0:
        raise ValueError(
            f"A process holds {num_rows} completions, not a multiple of num_generations={num_generations}: "
            "groups would straddle processes."
        )
    rows = process_index * num_rows + torch.arange(num_rows, device=device)
    return rows // num_generations


def shuffle_whole_groups(batch: dict[str, Any], group_ids: Tensor, generator: torch.Generator | None = None):
    """Permute whole groups of a generation batch, keeping each group's rows contiguous and in order.

    Replaces TRL's `shuffle_sequence_dict` (a row permutation that scatters groups across micro-batches).
    Tensors with a leading batch dimension and per-row lists are permuted; scalars and None pass through.
    """
    # mirrors trl.trainer.utils.shuffle_sequence_dict (trl 1.16.0): which values are permuted and how
    unique_groups, inverse = torch.unique_consecutive(group_ids, return_inverse=True)
    num_groups = unique_groups.numel()
    if torch.unique(group_ids).numel() != num_groups:
        raise ValueError("group_ids must be contiguous: the rows of one group must be adjacent")
    group_order = torch.randperm(num_groups, generator=generator)
    # Stable sort of each row's position in the new group order keeps the rows of a group in their order.
    new_rank = torch.empty_like(group_order)
    new_rank[group_order] = torch.arange(num_groups)
    row_order = torch.sort(new_rank[inverse.cpu()], stable=True).indices  # (N,)

    num_rows = group_ids.shape[0]

    def permute(value):
        if isinstance(value, Tensor) and value.ndim >= 1 and value.shape[0] == num_rows:
            return value[row_order.to(value.device)]
        if isinstance(value, list) and len(value) == num_rows:
            return [value[i] for i in row_order.tolist()]
        return value

    return {key: permute(value) for key, value in batch.items()}


def check_loss_routed_through_compute_loss(trainer_cls: type, use_liger_kernel: bool) -> None:
    """Raise if the installed stack would compute a loss other than our `_compute_loss`.

    - Unsloth rebinds `trl.GRPOTrainer` and replaces `compute_loss`: any class in the MRO from an Unsloth module, or a
      `compute_loss` that is not TRL's, means our objective would be silently dropped.
    - Liger: TRL <= 1.13 routed `use_liger_kernel=True` to a fused Liger GRPO loss that bypasses `_compute_loss`.
      TRL 1.16 only patches model kernels (RMSNorm, RoPE, SwiGLU) and keeps the loss in `_compute_loss`, so Liger is
      allowed there. We detect the old routing by the `compute_liger_loss` method it needed.
    """
    for klass in trainer_cls.__mro__:
        if "unsloth" in (klass.__module__ or "").lower() or "unsloth" in klass.__name__.lower():
            raise ValueError(
                f"{trainer_cls.__name__} derives from {klass.__module__}.{klass.__name__}: Unsloth's patched "
                "GRPOTrainer replaces `compute_loss`, which would silently train Unsloth's GRPO loss instead of this "
                "method's objective. Import trl_groupopt in a process that does not import unsloth (or import "
                "trl_groupopt before unsloth and do not use Unsloth's patched trainer)."
            )
    compute_loss_module = getattr(trainer_cls.compute_loss, "__module__", "") or ""
    if not compute_loss_module.startswith(("trl.", "trl_groupopt")):
        raise ValueError(
            f"{trainer_cls.__name__}.compute_loss comes from {compute_loss_module!r}, not TRL: something (e.g. "
            "Unsloth) patched the trainer and this method's objective would not be used. Remove the patch."
        )
    if use_liger_kernel and hasattr(trainer_cls, "compute_liger_loss"):
        raise ValueError(
            "use_liger_kernel=True makes this TRL version compute Liger's fused GRPO loss instead of `_compute_loss`, "
            "which would silently drop this method's objective. Set use_liger_kernel=False, or upgrade to trl>=1.16 "
            "where Liger only patches model kernels."
        )


def _is_passthrough(function: Callable) -> bool:
    """Whether `function` has the signature `(self, *args, **kwargs)`."""
    kinds = [param.kind for param in inspect.signature(function).parameters.values()]
    return kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL,
                     inspect.Parameter.VAR_KEYWORD]  # fmt: skip


def device_supports_bf16(use_cpu: bool = False) -> bool:
    """Whether bf16 mixed precision is both supported and worthwhile here: an accelerator with bf16 (Ampere+ GPU,
    XPU, NPU...) that training will use. CPU bf16 is emulated and slower than fp32 on most CPUs, so it stays off."""
    from transformers.utils import is_torch_bf16_gpu_available

    return not use_cpu and is_torch_bf16_gpu_available()


@dataclass(repr=False)
class TokenSafeConfigMixin:
    """Mixed into every method config (put it first, and use `@dataclass(repr=False)`).

    transformers pickles the whole config into every checkpoint and `output_dir` as `training_args.bin`, which
    `push_to_hub` uploads, and `@dataclass` regenerates a field-by-field `__repr__` that shows `hub_token`. The pickled
    state drops every `*_token` field and `repr()` is the redacting `str()` of `TrainingArguments`; the live object
    keeps its token for pushing.

    It also picks `bf16` for the device when the user leaves it unset (see `__post_init__`) and adds
    `max_all_none_reward_batches` (read with a default, so plain `GRPOConfig`s work too).
    """

    max_all_none_reward_batches: int = field(
        default=DEFAULT_MAX_ALL_NONE_REWARD_BATCHES,
        metadata={
            "help": "Stop training after this many consecutive generation batches in which every reward function "
            "returned None for every completion (each such batch warns, naming the functions and the columns)."
        },
    )

    def __post_init__(self):
        # TRL's `_BaseConfig.__post_init__` turns an unset bf16 into True, which transformers then rejects on a
        # CPU-only machine ("Your setup doesn't support bf16/gpu"). Decide first: bf16 only where the device has it.
        if self.bf16 is None:
            self.bf16 = not self.fp16 and device_supports_bf16(self.use_cpu)
        # TRL's default `gradient_checkpointing=True` is a deprecated alias in transformers 5 and warns on every
        # config; resolve it to `activation_checkpointing` as `TrainingArguments.__post_init__` would, silently.
        if getattr(self, "activation_checkpointing", False) is None and self.gradient_checkpointing is not None:
            self.activation_checkpointing = self.gradient_checkpointing
        if self.max_all_none_reward_batches < 1:
            raise ValueError(f"max_all_none_reward_batches must be >= 1, got {self.max_all_none_reward_batches}.")
        super().__post_init__()

    def __repr__(self) -> str:
        return str(self)

    def __getstate__(self) -> dict[str, Any]:
        return {key: (None if key.endswith("_token") else value) for key, value in self.__dict__.items()}


class GroupOptTrainer(GRPOTrainer):
    """`GRPOTrainer` whose policy objective is a pure function (see module docstring).

    Subclasses set `objective` (and, for advantage-transforming methods, `compute_advantages`), the class flags
    `requires_whole_groups` / `requires_raw_rewards`, and the model-card metadata `_name`, `_tag_names`, `_paper`.
    The base class itself trains TRL's GRPO/GSPO/DAPO objective.
    """

    _tag_names = ["trl", "grpo", "trl-groupopt"]
    _name = "GRPO (trl-groupopt base)"
    _paper = {
        "title": "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
        "id": "2402.03300",
        "citation": textwrap.dedent("""\
            @article{shao2024deepseekmath,
                title        = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
                author       = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
                year         = 2024,
                eprint       = {arXiv:2402.03300},
            }"""),
    }

    #: The config class this trainer reads its knobs from (a `GRPOConfig` subclass).
    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig
    #: Every micro-batch must hold whole groups, with a `group_ids` tensor (DFPO, OTB).
    requires_whole_groups: ClassVar[bool] = False
    #: The batch must carry the raw (weighted, un-normalised) rewards as `rewards` (OTB).
    requires_raw_rewards: ClassVar[bool] = False
    #: Whether TRL's `delta` (two-sided clip of the surrogate) has a meaning for this objective.
    supports_delta: ClassVar[bool] = True
    #: The fix to name when the schedule is on-policy and this method's mechanism is then inert (None: it is not).
    inert_on_policy_fix: ClassVar[str | None] = None
    #: The objective applies TRL's vLLM importance-sampling weights itself (passed in `inputs`); `_compute_loss` then
    #: does not multiply them again (DFPO folds them into its in-group transform).
    objective_applies_is_weights: ClassVar[bool] = False
    #: Whether this class changes TRL's policy loss or advantages (overrides `objective` or `compute_advantages`).
    #: Derived per subclass unless set explicitly. Only a class without its own objective is TRL's GRPO and may hand
    #: TRL's surrogate-replacing loss types (cispo, sapo, vespo) to `GRPOTrainer._compute_loss`.
    has_own_objective: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "has_own_objective" not in cls.__dict__:
            cls.has_own_objective = (
                cls.objective is not GroupOptTrainer.objective
                or cls.compute_advantages is not GroupOptTrainer.compute_advantages
            )
        # A subclass `__init__(self, *args, **kwargs)` forwards everything here: show GRPOTrainer's signature for it
        # (help(), IDEs and `inspect.signature` then list the same parameters as for GRPOTrainer).
        init = cls.__dict__.get("__init__")
        if init is not None and _is_passthrough(init):
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
        self.warn_if_inert_on_policy()

    def warn_if_inert_on_policy(self) -> None:
        """Warn (once, at construction) when TRL will train on-policy and this method's mechanism is then inert.

        On-policy is TRL's condition for skipping the behaviour forward (`old_per_token_logps` is None, every ratio
        is exactly 1): `gradient_accumulation_steps` is a multiple of `steps_per_generation * num_iterations`, and no
        vLLM importance-sampling correction.
        """
        if self.inert_on_policy_fix is None:
            return
        generate_every = self.args.steps_per_generation * self.num_iterations
        on_policy = self.args.gradient_accumulation_steps % generate_every == 0
        if on_policy and not (self.use_vllm and self.vllm_importance_sampling_correction):
            warnings.warn(
                f"{type(self).__name__}: this schedule is on-policy (steps_per_generation="
                f"{self.args.steps_per_generation}, gradient_accumulation_steps={self.args.gradient_accumulation_steps}"
                f", num_iterations={self.num_iterations}): every importance ratio is 1 and {self.inert_on_policy_fix}",
                UserWarning,
                stacklevel=3,
            )

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
            pass  # TRL's own `_compute_loss` computes it (see `_compute_loss`)
        elif args.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={args.loss_type!r} is not supported by {cls.__name__}: TRL's cispo/sapo/vespo replace the "
                f"policy surrogate itself (GroupOptTrainer with a GRPOConfig runs them with TRL's own loss). "
                f"Use one of {SUPPORTED_LOSS_TYPES}."
            )
        if args.delta is not None and not cls.supports_delta:
            raise ValueError(f"delta={args.delta} has no meaning for {cls.__name__}'s objective; leave delta=None.")
        if cls.needs_whole_groups(args):
            num_generations = args.num_generations
            if num_generations is None or num_generations < 2:
                raise ValueError(
                    f"{cls.__name__} compares the completions of a group: num_generations must be >= 2, "
                    f"got {num_generations}."
                )
            batch_size = args.per_device_train_batch_size
            if batch_size % num_generations != 0:
                working = [num_generations * k for k in range(1, 5)]
                raise ValueError(
                    f"{cls.__name__} needs whole groups in every micro-batch: per_device_train_batch_size "
                    f"({batch_size}) must be a multiple of num_generations ({num_generations}). "
                    f"Use per_device_train_batch_size in {working}, or a num_generations that divides {batch_size}."
                )

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None, **kwargs):
        """TRL's card plus the method's knobs and the reward-curve summary (see `trl_groupopt.model_card`)."""
        from ..model_card import create_model_card

        create_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """transformers' `_save`, then our card in the saved folder (replacing PEFT's empty template for adapters)."""
        super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            self.create_model_card(output_dir=output_dir if output_dir is not None else self.args.output_dir)

    # ------------------------------------------------------------------ the method's hooks
    def objective(
        self,
        per_token_logps: Tensor,
        old_per_token_logps: Tensor,
        advantages: Tensor,
        mask: Tensor,
        inputs: dict[str, Any],
    ) -> ObjectiveOutput:
        """The policy loss before masking and aggregation. Default: TRL's clipped surrogate (GRPO/GSPO)."""
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

    # ------------------------------------------------------------------ batching
    def _generate_and_score_completions(self, inputs):
        if self.requires_raw_rewards:
            self._raw_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        num_rows = output["completion_ids"].shape[0]
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        if self.whole_groups:
            output["group_ids"] = group_ids_for_local_batch(
                num_rows, num_generations, self.accelerator.process_index, output["completion_ids"].device
            )
            if self.environment_factories is None:
                self._check_groups_share_prompts(output["prompt_ids"], num_generations)
            else:  # each rollout's `reset()` may extend its prompt: the group is the sampler's, the dataset row's
                self._check_groups_share_rows([x.get("prompt") for x in inputs], num_generations)
        if self.requires_raw_rewards:
            output["rewards"] = self._local_raw_rewards(num_rows)
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Environment-owned rewards (`get_reward`) are one more column of TRL's (N_global, F) matrix, with weight 1.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        watch_all_none_rewards(self, rewards_per_func, inputs)  # warn, then stop, when no reward is ever returned
        if self.requires_raw_rewards:
            self._raw_rewards_per_func = rewards_per_func  # (N_global, F), gathered over processes
        return rewards_per_func

    def _local_raw_rewards(self, num_rows: int) -> Tensor:
        """(num_rows,) weighted sum of the reward functions for this process's rows; NaN where unscorable.

        The same combination TRL logs as `reward` (weights applied, NaN-skipping sum, NaN when every reward function
        returned None), before any group centring or scaling. Environment-owned rewards are included (TRL appends
        them as a reward column with weight 1).
        """
        # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): the `rewards` sum and `process_slice`
        rewards_per_func = self._raw_rewards_per_func
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)  # (N_global,)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        start = self.accelerator.process_index * num_rows
        return rewards[start : start + num_rows]

    @staticmethod
    def _check_groups_share_prompts(prompt_ids: Tensor, num_generations: int) -> None:
        """Every row of a group must hold the same prompt; anything else means groups were misaligned."""
        grouped = prompt_ids.view(-1, num_generations, prompt_ids.size(-1))  # (K, G, P)
        if not torch.equal(grouped, grouped[:, :1].expand_as(grouped)):
            raise RuntimeError(
                "Completions of one group carry different prompts: the sampler did not deliver whole groups to this "
                "process. Please report this with your accelerate and TRL versions."
            )

    @staticmethod
    def _check_groups_share_rows(prompts: list[Any], num_generations: int) -> None:
        """As `_check_groups_share_prompts`, on the dataset rows' prompts, before an environment's `reset()` edits
        them (rollouts of one row may then see different prompts, as in TRL)."""
        for start in range(0, len(prompts), num_generations):
            if any(p != prompts[start] for p in prompts[start : start + num_generations]):
                raise RuntimeError(
                    "Completions of one group come from different dataset rows: the sampler did not deliver whole "
                    "groups to this process. Please report this with your accelerate and TRL versions."
                )

    def _prepare_inputs(self, generation_batch):
        """TRL's `_prepare_inputs`, with a shuffle of whole groups in place of the row shuffle (group methods)."""
        if not self.whole_groups or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        # mirrors GRPOTrainer._prepare_inputs (trl 1.16.0), train branch; only the shuffle differs
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            generation_batch = self._generate_and_score_completions(generation_batch)
            generation_batch = split_pixel_values_by_grid(generation_batch)
            generation_batch = shuffle_whole_groups(generation_batch, generation_batch["group_ids"])
            generation_batches = split_tensor_dict(generation_batch, self.args.steps_per_generation)
            self._buffered_inputs = [unsplit_pixel_values_by_grid(batch) for batch in generation_batches]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ------------------------------------------------------------------ the loss
    def _forward_logps_and_entropies(self, model, inputs: dict[str, Any]):
        """Per-token log-probs, entropies and MoE aux loss of the completion, via TRL's own forward."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): its `_get_per_token_logps_and_entropies` call
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        multimodal_keys = (
            "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
            "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
        )  # fmt: skip
        return self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([prompt_mask, completion_mask], dim=1),
            completion_ids.size(1),  # logits only for the completion tokens
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in multimodal_keys},
        )

    def _compute_loss(self, model, inputs):
        if self.loss_type in TRL_SURROGATE_LOSS_TYPES and not self.has_own_objective:
            return super()._compute_loss(model, inputs)  # TRL's cispo/sapo/vespo, warnings and metrics included
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): mask, old log-probs, OPSM, entropy mask, vLLM IS, KL,
        # entropy bonus, aux loss and metric names, in TRL's order; only the surrogate and advantages are pluggable
        mode = "train" if self.model.training else "eval"
        completion_mask = inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (B, T)

        per_token_logps, entropies, aux_loss = self._forward_logps_and_entropies(model, inputs)  # (B, T) each
        # On-policy TRL skips the behaviour forward: the ratio is then exactly 1 (old = sg(current)).
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        advantages = self.compute_advantages(inputs, per_token_logps, mask)  # (B,) or (B, T)
        advantages_2d = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)

        out = self.objective(per_token_logps, old_per_token_logps, advantages, mask, inputs)
        per_token_loss = out.per_token_loss  # (B, T) or (B, 1)

        # ---- TRL's shared extras, in TRL's order
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=advantages_2d,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_per_token_logps),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )  # (B, 1)
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)  # (B, T)
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction and not self.objective_applies_is_weights:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]  # (B, T) or (B, 1)
        if self.beta != 0.0:
            per_token_kl = self._per_token_kl(
                per_token_logps, old_per_token_logps, inputs["ref_per_token_logps"], mask
            )
            per_token_loss = per_token_loss + self.beta * per_token_kl

        loss, policy_loss = self._aggregate(per_token_loss, mask, inputs, mode)
        if self._entropy_bonus_enabled:
            effective_mask = mask if entropy_mask is None else mask * entropy_mask
            loss = loss - self._entropy_bonus(entropies, effective_mask, mode)
            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
        if self.aux_loss_enabled:
            accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        # ---- metrics, with TRL's names
        shared = {"entropy": entropies, **({"kl": per_token_kl} if self.beta != 0.0 else {})}  # (B, T) each
        self._log_objective_metrics({**out.metrics, **shared}, mask, mode)
        self._flush_metrics()  # this micro-batch's metrics (and any a hook queued): one collective, one sync
        return loss

    def _per_token_kl(self, per_token_logps, old_per_token_logps, ref_per_token_logps, mask) -> Tensor:
        """k3 estimator of KL(pi_theta || pi_ref), TRL's form; times the IS weight with `use_bias_correction_kl`."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): `per_token_kl` and its bias correction
        delta = ref_per_token_logps - per_token_logps  # (B, T)
        per_token_kl = torch.exp(delta) - delta - 1  # (B, T)
        if self.args.use_bias_correction_kl:
            log_weights = log_importance_weights(  # (B, T) or (B, 1), as the default objective's
                per_token_logps - old_per_token_logps, mask, self.importance_sampling_level
            )
            per_token_kl = per_token_kl * torch.exp(log_weights)
        return per_token_kl

    def _aggregate(self, per_token_loss: Tensor, mask: Tensor, inputs, mode: str) -> tuple[Tensor, Tensor]:
        """TRL 1.16's `loss_type` aggregation and gradient-accumulation scaling. Returns (loss, policy_loss)."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `loss_type` branches (grpo, bnpo, dr_grpo, dapo, luspo)
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accum in eval
        if self.loss_type == "grpo":
            loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        elif self.loss_type == "bnpo":
            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
        elif self.loss_type == "dr_grpo":
            loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)
        elif self.loss_type == "luspo":
            loss = (per_token_loss * mask).sum(-1).mean()
        elif self.loss_type == "dapo":
            # `num_items_in_batch` counts the tokens of the whole generation batch on all processes: rescale it to
            # one accumulation window on one process (TRL's normaliser), so no further division by accumulation.
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            loss = (per_token_loss * mask).sum() / normalizer
            return loss, loss.detach()
        else:  # validate_args rejects the others; kept for subclasses that bypass it
            raise ValueError(f"Unsupported loss_type {self.loss_type!r}; use one of {SUPPORTED_LOSS_TYPES}")
        return loss / accumulation, loss.detach()

    def _entropy_bonus(self, entropies: Tensor, effective_mask: Tensor, mode: str) -> Tensor:
        """coef * mean token entropy, TRL 1.16's static or adaptive entropy bonus (to be subtracted from the loss)."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `_entropy_bonus_enabled` block and adaptive controller
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
        # The coefficient from the end of the previous optimizer step: every micro-batch of a window applies the same.
        apply_coef = self.entropy_coef
        if self.use_adaptive_entropy and self._last_world_entropy > self.args.entropy_target:
            apply_coef = 0.0
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
            self._entropy_window_stats = (
                stats if self._entropy_window_stats is None else self._entropy_window_stats + stats
            )
            if self.accelerator.sync_gradients:  # optimizer-step boundary: window-global entropy over all ranks
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                if world_entropy <= self.args.entropy_target:
                    self.entropy_coef = min(
                        self.entropy_coef + self.args.entropy_coef_delta, self.args.entropy_coef_max
                    )
                else:
                    self.entropy_coef = max(
                        self.entropy_coef - self.args.entropy_coef_delta, self.args.entropy_coef_min
                    )
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return apply_coef * entropy_loss

    # ------------------------------------------------------------------ metrics
    @staticmethod
    def _masked_stats(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Local (sum, count) of a token-weighted mean ((B, 1) values: one per sequence, mask unused), as TRL."""
        if values.shape[1] == 1:
            return values.sum(), values.new_tensor(float(values.shape[0]))
        mask = mask.to(values.dtype)
        return (values * mask).sum(), mask.sum()

    def _global_masked_mean(self, values: Tensor, mask: Tensor) -> float:
        """Token-weighted mean over all processes ((B, 1) values: one per sequence), as TRL logs it."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): its local `global_masked_mean`
        totals = self.accelerator.reduce(torch.stack(self._masked_stats(values.float(), mask)), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def _log_objective_metrics(self, metrics: dict[str, Tensor], mask: Tensor, mode: str) -> None:
        """Queue an objective's metrics for `_flush_metrics`, which `_compute_loss` calls once at its end.

        Per-token (B, T) / per-sequence (B, 1) tensors are reduced as TRL reduces its clip indicators (global masked
        mean, and per-sequence min/max for `clip_ratio/low` / `high`); scalars are averaged over processes ignoring
        NaN. `clip_ratio/*` keys get TRL's names. Queued, so that every metric of a micro-batch costs one collective
        and one host sync in all (TRL: one of each per metric, which stalls a GPU a dozen times per micro-batch).
        """
        self.__dict__.setdefault("_queued_objective_metrics", []).append((metrics, mask, mode))

    def _flush_metrics(self) -> None:
        """Reduce every queued metric over processes with ONE gather and ONE `.tolist()`, and log the results."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `clip_ratio/*` metrics (names, nanmin/nanmax over
        # sequences) and `global_masked_mean`, batched into one collective
        pending, self._queued_objective_metrics = self.__dict__.get("_queued_objective_metrics", []), []
        columns: list[tuple[str, str, str]] = []  # (mode, logged name, reduction: mean | nanmean | min | max)
        local: list[Tensor] = []  # two entries per column
        for metrics, mask, mode in pending:
            for name in sorted(metrics):  # the same order on every rank: the columns of one gathered tensor
                value = metrics[name].detach().float()
                logged = name + "_mean" if name in _CLIP_METRICS else name
                if value.dim() == 2:
                    local += self._masked_stats(value, mask)
                    columns.append((mode, logged, "mean"))
                    if name in ("clip_ratio/low", "clip_ratio/high"):
                        per_sequence = (
                            value.squeeze(1) if value.shape[1] == 1 else (value * mask).sum(-1) / mask.sum(-1)
                        )
                        low = name.endswith("low")
                        fill = torch.full_like(per_sequence, float("inf") if low else float("-inf"))
                        per_sequence = torch.where(torch.isnan(per_sequence), fill, per_sequence)  # TRL's nanmin/max
                        extreme = per_sequence.amin() if low else per_sequence.amax()
                        local += [extreme, extreme]
                        columns.append((mode, name + ("_min" if low else "_max"), "min" if low else "max"))
                else:
                    value = value.reshape(())
                    finite = ~torch.isnan(value)
                    local += [torch.where(finite, value, torch.zeros_like(value)), finite.float()]
                    columns.append((mode, logged, "nanmean"))
        if not columns:
            return
        device = self.accelerator.device
        stats = torch.stack([t.to(device) for t in local]).view(1, len(columns), 2)  # (1, K, 2)
        gathered = self.accelerator.gather(stats)  # (P, K, 2)
        sums, mins, maxs = gathered.sum(0), gathered.amin(0), gathered.amax(0)  # (K, 2) each
        mean = sums[:, 0] / sums[:, 1].clamp(min=1.0)  # TRL: 0 for an empty mask
        nanmean = torch.where(sums[:, 1] > 0, mean, torch.full_like(mean, float("nan")))  # gather().nanmean()
        kinds = {"mean": mean, "nanmean": nanmean, "min": mins[:, 0], "max": maxs[:, 0]}
        table = torch.stack([kinds[kind] for kind in ("mean", "nanmean", "min", "max")]).tolist()  # the one sync
        for k, (mode, logged, kind) in enumerate(columns):
            value = table[("mean", "nanmean", "min", "max").index(kind)][k]
            self._metrics[mode][logged].append(float("nan") if value in (float("inf"), float("-inf")) else value)


register_method(
    "grpo",
    config_class=GRPOConfig,
    trainer_class=GroupOptTrainer,
    paper="arXiv:2402.03300",
    headline_metric="clip_ratio/region_mean",
    summary="TRL's GRPO objective through the shared loss path (the baseline)",
)
