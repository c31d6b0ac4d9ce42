"""OTB: the optimal token baseline, from the logit-gradient energy of the forwards TRL already runs.

Paper: Li et al., "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL", arXiv:2602.07078.
Equations in `trl_groupopt.objectives.otb`; derivation and deviations in `docs/otb.md`.

Where the energy comes from. TRL computes log-probs with a fused, tiled LM head that can also return
`log_sum_sq_probs = log sum_v p_v^2` (no gradient) from the same tiles. This trainer asks the head for that field and
overrides `_get_per_token_logps_and_entropies` so that every call records the energy beside the log-probs it returns:
no second forward, never a (B, T, V) tensor, no gradient through the energy, no module hook. The behaviour-policy
forward (run by TRL for `old_per_token_logps` when training is off-policy) puts its energy in the batch as
`old_per_token_energy`, the policy that sampled the completions, as verl does; on-policy TRL skips that forward and the
training forward's energy is used directly, which is then the same policy's. Off-policy the training forward's energy
would be unused, so that forward runs TRL's own head (log-probs and entropy only), which saves the energy's extra
log-sum-exp over the vocabulary.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from accelerate.utils import is_peft_model
from torch import Tensor
from trl import GRPOConfig
from trl.trainer.utils import add_fused_lm_head

from ..objectives.common import check_positive, group_mean
from ..objectives.otb import TOKEN_POSITIONS, energy_from_log_probs, otb_advantages
from ..registry import register_method
from .base import GroupOptTrainer, TokenSafeConfigMixin


@dataclass(repr=False)
class OTBConfig(TokenSafeConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`OTBTrainer`].

    Inherits every parameter of [`trl.GRPOConfig`]; the policy loss is TRL's (set by `loss_type`,
    `importance_sampling_level`, `epsilon`...), only the advantages change: `A_it = G_i - b_t` with the optimal token
    baseline `b_t` of the group (raw rewards, no std normalisation; `docs/otb.md`).

    The paper's claim: OTB with a group of N=4 matches a group-mean baseline with N=32; `benchmarks/sample_efficiency.py`
    tests it here (OTB N=4 against GRPO N=4 and N=16 at equal prompts).

    The defaults reproduce verl's two reference estimators with their own defaults: a single-turn batch (no
    `tool_mask`) gets `optimal_token_baseline` (no zero tail), a multi-turn tool-use batch (TRL's `tool_mask`, from
    `tools`, `environment_factory` or a `rollout_func`'s `env_mask`) gets `tir_optimal_token_baseline` (valid-token
    positions, zero tail on).

    Parameters:
        scale_rewards (`str`, *optional*, defaults to `"none"`):
            As the reference implementation (only TRL's logged advantages use it; OTB uses the raw rewards).
        otb_token_positions (`str`, *optional*, defaults to `"valid"`):
            What the position `t` of the baseline `b_t` counts when the loss mask has holes (tool results under TRL's
            `tool_mask`). `"valid"`: each row's valid tokens are compacted first, so `b_t` compares the t-th *generated*
            token of every member, as verl's tool-use estimator does; `"absolute"`: the column index, as verl's
            single-turn estimator. Identical when no mask has holes (single-turn), so `"valid"` is the default: it is
            the single-turn estimator there and the tool-use one under a `tool_mask`, where comparing a member's
            generated token with another member's tool output would make no sense.
        otb_handle_zero_tail (`bool` or `None`, *optional*, defaults to `None`):
            Zero the baseline of a group's unique longest member past the second-longest valid-token count, where it
            would otherwise be compared with itself (`b_t ~ G_i`, no learning signal on its tail). `None` follows verl's
            defaults per estimator: on for batches with a `tool_mask` (verl's tool-use estimator defaults it to True),
            off otherwise (verl's single-turn estimator defaults it to False). `True` / `False` force it.
    """

    scale_rewards: str = field(default="none", metadata={"help": "OTB uses raw rewards; as the reference, 'none'."})
    otb_token_positions: str = field(
        default="valid",
        metadata={
            "help": "Position index of the baseline under a tool mask: 'valid' (k-th generated token, verl's tool-use "
            "estimator) or 'absolute' (column index, verl's single-turn estimator). Identical without holes.",
            "choices": list(TOKEN_POSITIONS),
        },
    )
    otb_handle_zero_tail: bool | None = field(
        default=None,
        metadata={
            "help": "Baseline 0 on a group's unique longest completion past the second-longest. Default (unset): on "
            "for tool-use batches (tool_mask), off otherwise, as verl's two estimators."
        },
    )

    def __post_init__(self):
        # Checked before TRL's own post-init: a bad value fails at once, naming the field and the fix.
        try:
            check_positive(epsilon=self.epsilon)
            if self.epsilon_high is not None:
                check_positive(epsilon_high=self.epsilon_high)
        except ValueError as err:
            raise ValueError(
                f"OTBConfig: {err}. The surrogate clips the ratio to [1 - epsilon, 1 + epsilon_high]: use a positive "
                "value (TRL's default epsilon is 0.2; leave epsilon_high unset to use epsilon)."
            ) from None
        if self.delta is not None and not self.delta > 0:
            raise ValueError(f"OTBConfig: delta must be > 0 (the surrogate's upper clip, e.g. 1.5), got {self.delta}.")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                "OTBConfig: importance_sampling_level must be 'token' or 'sequence', "
                f"got {self.importance_sampling_level!r}."
            )
        if self.scale_rewards not in (True, False, "group", "batch", "none"):
            raise ValueError(
                f"OTBConfig: scale_rewards must be 'none' (OTB's default), 'group' or 'batch', got {self.scale_rewards!r}."
            )
        if self.otb_token_positions not in TOKEN_POSITIONS:
            raise ValueError(
                f"OTBConfig: otb_token_positions must be one of {TOKEN_POSITIONS}, got {self.otb_token_positions!r}."
            )
        if self.otb_handle_zero_tail not in (None, True, False):
            raise ValueError(
                "OTBConfig: otb_handle_zero_tail must be True, False or None (None: on for tool-use batches only), "
                f"got {self.otb_handle_zero_tail!r}."
            )
        super().__post_init__()


# The loss types whose loss `GroupOptTrainer._compute_loss` computes from `compute_advantages` (OTB's advantages).
OTB_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


class _EnergyRecord(NamedTuple):
    """One `_get_per_token_logps_and_entropies` call: the log-probs it returned and their energy (None when the model
    called has no `log_sum_sq_probs` field, e.g. a separate reference model)."""

    per_token_logps: Tensor  # (B, T)
    energy: Tensor | None  # (B, T), detached


class _FusedOutputRecorder:
    """Stands in for the model during one `_get_per_token_logps_and_entropies` call and keeps each forward's
    `log_sum_sq_probs`. Calls and attribute reads go to the model (whatever wrapper it is: DDP, FSDP, PEFT) unchanged."""

    def __init__(self, model):
        self.model = model
        self.log_sum_sq_probs: list[Tensor | None] = []

    def __call__(self, *args, **kwargs):
        output = self.model(*args, **kwargs)
        self.log_sum_sq_probs.append(getattr(output, "log_sum_sq_probs", None))
        return output

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)


class OTBTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with OTB advantages (optimal token baseline from the logit-gradient energy)."""

    config_class = OTBConfig
    _tag_names = ["trl", "otb", "trl-groupopt"]
    _name = "OTB"
    _paper = {
        "title": "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL",
        "id": "2602.07078",
        "citation": textwrap.dedent("""\
            @article{li2026optimal,
                title        = {{The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL}},
                author       = {Yingru Li and Jiawei Xu and Ziniu Li and Jiacai Liu and Wei Liu and Yuxuan Tong and Longtao Zheng and Zhenghai Xue and Yaxiang Zhang and Tianle Cai and Ge Zhang and Qian Liu and Baoxiang Wang},
                year         = 2026,
                eprint       = {arXiv:2602.07078},
            }"""),
    }
    requires_whole_groups = True
    requires_raw_rewards = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # TRL's fused head computes only `log_probs` and `entropy`; re-patch it (TRL's public helper, applied on top of
        # TRL's own patch, to the module TRL patched) so that it also returns `log_sum_sq_probs` from the same tiles.
        # TRL's head is kept for the forwards whose energy is unused (`_lm_head_without_energy`).
        self._head_module = self.model.get_base_model() if is_peft_model(self.model) else self.model
        self._trl_head_forward = self._head_module.forward
        add_fused_lm_head(
            self._head_module,
            temperature=self.temperature,
            cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
            outputs=("log_probs", "entropy", "log_sum_sq_probs"),
        )
        self._otb_head_forward = self._head_module.forward
        self._energy_records: list[_EnergyRecord] = []
        self._training_energy: Tensor | None = None

    @classmethod
    def validate_args(cls, args: GRPOConfig) -> None:
        super().validate_args(args)
        # OTB keeps the base's default objective and changes only the advantages: a loss type for which the base
        # defers to TRL's own loss would train on TRL's group-mean advantages instead, so OTB rejects it itself.
        if args.loss_type not in OTB_LOSS_TYPES:
            raise ValueError(
                f"loss_type={args.loss_type!r} is not supported by {cls.__name__}: TRL's cispo/sapo/vespo compute "
                f"their own loss from TRL's group-mean advantages, which would drop OTB's. Use one of "
                f"{OTB_LOSS_TYPES}."
            )

    # ---- every log-prob forward records its energy
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's method, run with a recorder in place of `model`; records `(log-probs, energy)` of this call."""
        recorder = _FusedOutputRecorder(model)
        per_token_logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(
            recorder, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        fields = recorder.log_sum_sq_probs
        energy = None
        if fields and all(f is not None for f in fields):
            # mirrors TRL's `_get_per_token_logps_and_entropies`: `log_probs[:, -logits_to_keep:]` per chunk, concatenated
            log_sum_sq = torch.cat([f[:, -logits_to_keep:] for f in fields])  # (B, T)
            energy = energy_from_log_probs(per_token_logps, log_sum_sq)  # (B, T), detached
        self._energy_records.append(_EnergyRecord(per_token_logps, energy))
        return per_token_logps, entropies, aux_loss

    def _take_energy(self, per_token_logps: Tensor, forward: str) -> Tensor:
        """The energy recorded beside `per_token_logps` (the very tensor a recorded call returned); clears the records."""
        records, self._energy_records = self._energy_records, []
        for record in records:
            if record.per_token_logps is per_token_logps and record.energy is not None:
                return record.energy
        raise RuntimeError(
            f"OTB found no energy for the {forward} forward: TRL's `_get_per_token_logps_and_entropies` did not return "
            "the log-probs of a fused-head call with `log_sum_sq_probs`. This TRL version computes log-probs "
            "differently; please report it with your TRL version."
        )

    def _generate_and_score_completions(self, inputs):
        self._energy_records = []
        output = super()._generate_and_score_completions(inputs)
        old = output.get("old_per_token_logps")
        if old is not None:  # off-policy: the behaviour policy's energy, as a batch field
            output["old_per_token_energy"] = self._take_energy(old, "behaviour-policy")
        self._energy_records = []  # e.g. the reference forward's record
        return output

    @contextmanager
    def _lm_head_without_energy(self) -> Iterator[None]:
        """TRL's own fused head (log-probs and entropy, no `log_sum_sq_probs`) for the forwards inside."""
        self._head_module.forward = self._trl_head_forward
        try:
            yield
        finally:
            self._head_module.forward = self._otb_head_forward

    def _forward_logps_and_entropies(self, model, inputs):
        self._energy_records = []
        if "old_per_token_energy" in inputs:  # off-policy: the advantages use the behaviour policy's energy
            with self._lm_head_without_energy():
                output = super()._forward_logps_and_entropies(model, inputs)
            self._energy_records, self._training_energy = [], None
            return output
        per_token_logps, entropies, aux_loss = super()._forward_logps_and_entropies(model, inputs)
        self._training_energy = self._take_energy(per_token_logps, "training")
        return per_token_logps, entropies, aux_loss

    def zero_tail_for(self, inputs: dict[str, Any]) -> bool:
        """`otb_handle_zero_tail`, with `None` resolved per batch: on for tool-use batches (a `tool_mask`)."""
        zero_tail = self.args.otb_handle_zero_tail
        return "tool_mask" in inputs if zero_tail is None else bool(zero_tail)

    def compute_advantages(self, inputs: dict[str, Any], per_token_logps: Tensor, mask: Tensor) -> Tensor:
        energy = inputs.get("old_per_token_energy")  # (B, T) behaviour policy's, off-policy
        if energy is None:
            energy = self._training_energy  # (B, T) on-policy: the training forward's, same policy
        weights = inputs.get("importance_sampling_ratio")  # vLLM IS ratio: (B, T) or (B, 1), squared into e
        rewards = inputs["rewards"]  # (B,) raw, NaN where unscorable
        advantages = otb_advantages(
            rewards,
            energy,
            mask,
            inputs["group_ids"],
            handle_zero_tail=self.zero_tail_for(inputs),
            token_positions=self.args.otb_token_positions,
            importance_weights=None if weights is None else weights.expand_as(mask).to(energy.dtype),
        )  # (B, T)
        self._log_otb_metrics(rewards, energy, advantages, mask, inputs["group_ids"])
        return advantages

    def _log_otb_metrics(self, rewards, energy, advantages, mask, group_ids) -> None:
        """Token-weighted means over every process's scored tokens (the base's `_flush_metrics` reduces (B, T)
        metrics as TRL's `global_masked_mean`), so 2 processes log what 1 process logs for the same batch."""
        mode = "train" if self.model.training else "eval"
        valid = (mask * (~torch.isnan(rewards)).unsqueeze(1)).bool()  # (B, T)
        returns = torch.nan_to_num(rewards).unsqueeze(1)  # (B, 1)
        baseline = returns - advantages  # (B, T) b_t where valid
        # Variance proxy: E[A^2 ||grad log p||^2] (the token gradient's second moment) vs the group-mean baseline's.
        group_adv = (returns.squeeze(1) - group_mean(returns.squeeze(1), group_ids)).unsqueeze(1)  # (B, 1)
        per_token = {
            "otb/energy_mean": energy,
            "otb/baseline_mean": baseline,
            "otb/adv_abs_mean": advantages.abs(),
            "otb/grad_second_moment": advantages**2 * energy,
            "otb/grad_second_moment_group_mean_baseline": group_adv**2 * energy,
        }  # (B, T) each; zero where not valid, so padding's non-finite values never reach a sum
        metrics = {k: torch.where(valid, v.detach(), torch.zeros_like(v)) for k, v in per_token.items()}
        self._log_objective_metrics(metrics, valid.to(energy.dtype), mode)


register_method(
    "otb",
    config_class=OTBConfig,
    trainer_class=OTBTrainer,
    paper="arXiv:2602.07078",
    headline_metric="otb/grad_second_moment",
    summary="advantages G_i - b_t with the optimal token baseline from the logit-gradient energy",
)
