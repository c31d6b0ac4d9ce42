"""OTB: advantages `G_i - b_t` from the optimal token baseline, on TRL's policy loss.

The paper and registry entry: `trl_groupopt/methods/otb.py`. Equations in `trl_groupopt.objectives.otb`; derivation
and deviations in `docs/otb.md`. The energy the baseline weighs tokens by comes from the forwards TRL already runs
(`EnergyCaptureMixin`, `energy.py`); this module turns it into advantages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from trl import GRPOConfig

from ..methods import otb
from ..objectives.common import check_positive, group_mean
from ..objectives.otb import TOKEN_POSITIONS, otb_advantages, validate_otb
from .base import GroupOptTrainer
from .config import TokenSafeConfigMixin
from .energy import EnergyCaptureMixin
from .loss import SUPPORTED_LOSS_TYPES


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
        validate_otb(token_positions=self.otb_token_positions, names={"token_positions": "otb_token_positions"})
        if self.otb_handle_zero_tail not in (None, True, False):
            raise ValueError(
                "OTBConfig: otb_handle_zero_tail must be True, False or None (None: on for tool-use batches only), "
                f"got {self.otb_handle_zero_tail!r}."
            )
        super().__post_init__()


class OTBTrainer(EnergyCaptureMixin, GroupOptTrainer):
    """[`trl.GRPOTrainer`] with OTB advantages (optimal token baseline from the logit-gradient energy)."""

    method_spec = otb.METHOD
    config_class = OTBConfig
    requires_whole_groups = True
    requires_raw_rewards = True

    @classmethod
    def validate_args(cls, args: GRPOConfig) -> None:
        super().validate_args(args)
        # OTB keeps the base's default objective and changes only the advantages: a loss type for which the base
        # defers to TRL's own loss would train on TRL's group-mean advantages instead. The base rejects those for
        # every class with its own advantages (OTB included); this check keeps OTB's reason should that change.
        if args.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={args.loss_type!r} is not supported by {cls.__name__}: TRL's cispo/sapo/vespo compute "
                f"their own loss from TRL's group-mean advantages, which would drop OTB's. Use one of "
                f"{SUPPORTED_LOSS_TYPES}."
            )

    def zero_tail_for(self, inputs: dict[str, Any]) -> bool:
        """`otb_handle_zero_tail`, with `None` resolved per batch: on for tool-use batches (a `tool_mask`)."""
        zero_tail = self.args.otb_handle_zero_tail
        return "tool_mask" in inputs if zero_tail is None else bool(zero_tail)

    def compute_advantages(self, inputs: dict[str, Any], per_token_logps: Tensor, mask: Tensor) -> Tensor:
        energy = self.rollout_energy(inputs)  # (B, T) of the policy that sampled the completions
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
