"""CTPO (cumulative token ratio, position-adaptive log-space clip): config and trainer. Equations:
`trl_groupopt.methods.ctpo.objective`; docs/ctpo.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor
from trl import GRPOConfig

from ...core.common import ObjectiveOutput, check_choice, check_positive
from ...core.numerics import ClipWindow
from ...trainer.base import GroupOptTrainer
from ...trainer.config import AdvantageEstimatorConfigMixin, TokenSafeConfigMixin
from ...trainer.schedule import OffPolicyScheduleMixin
from .objective import DEFAULT_POSITION_POWER, RATIO_MODES, ctpo_loss


@dataclass(repr=False)
class CTPOConfig(TokenSafeConfigMixin, AdvantageEstimatorConfigMixin, OffPolicyScheduleMixin, GRPOConfig):
    r"""
    Configuration class for [`CTPOTrainer`]: every parameter of [`trl.GRPOConfig`], CTPO's own fields, and the
    authors' defaults (`ctpo.sh` in github.com/horizon-llm/CTPO): `epsilon` / `epsilon_high` are *log-space* bounds
    per unit of `t**p` (arXiv:2605.07331; docs/ctpo.md).
    """

    #: The authors' schedule (ctpo.sh): a 512-prompt rollout trained in mini-batches of 32 prompts.
    updates_per_rollout: ClassVar[int] = 16

    epsilon: float = field(default=0.025, metadata={"help": "Lower log-space clip bound per unit of t**p."})
    epsilon_high: float | None = field(default=0.05, metadata={"help": "Upper log-space clip bound per unit of t**p."})
    ctpo_dual_clip: float = field(
        default=0.05, metadata={"help": "Dual clip for A < 0: loss capped at -A * exp(ctpo_dual_clip * t**p)."}
    )
    ctpo_ratio_mode: str = field(
        default="cumprod", metadata={"help": "cumprod (prefix ratio) | geomean (its geometric mean)."}
    )
    ctpo_position_power: float | None = field(
        default=None,
        metadata={"help": "Power p of the position scaling t**p; default 0.5 (cumprod) or -0.5 (geomean)."},
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_truncate", metadata={"help": "vLLM IS correction; the authors' sequence-level truncation."}
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=5.0, metadata={"help": "vLLM IS cap; the authors' 5.0."}
    )
    loss_type: str = field(default="dapo", metadata={"help": "Aggregation; the authors use token-mean (dapo)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; the authors use none."})

    def __post_init__(self):
        super().__post_init__()
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.ctpo_position_power is None and self.ctpo_ratio_mode in DEFAULT_POSITION_POWER:
            self.ctpo_position_power = DEFAULT_POSITION_POWER[self.ctpo_ratio_mode]
        check_positive(epsilon=self.epsilon, epsilon_high=self.epsilon_high, reason=" for CTPO (a log-space bound)")
        check_positive(finite=True, reason=" for CTPO (a log-space bound)", ctpo_dual_clip=self.ctpo_dual_clip)
        check_choice("ctpo_ratio_mode", self.ctpo_ratio_mode, RATIO_MODES)
        if not math.isfinite(self.ctpo_position_power):
            raise ValueError(f"ctpo_position_power must be finite, got {self.ctpo_position_power}.")
        if self.ctpo_ratio_mode == "cumprod" and self.ctpo_position_power < 0:
            raise ValueError(
                "ctpo_position_power must be >= 0 with ctpo_ratio_mode='cumprod' (0.5 = the paper's sqrt(t): the "
                f"prefix log-ratio's spread grows with t), got {self.ctpo_position_power}. Negative powers (the "
                "authors' -0.5) go with ctpo_ratio_mode='geomean'."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "CTPO builds its own cumulative (prefix) ratio from token log-ratios: set importance_sampling_level="
                f"'token' (got {self.importance_sampling_level!r})."
            )

    def clip_windows(self) -> tuple[ClipWindow, ...]:
        """The clip the forward's noise is measured against (`trl_groupopt/trainer/numerics.py`): the position-scaled
        log-space bound of the prefix log-ratio L_t, +-epsilon * t**p."""
        level = "prefix_mean" if self.ctpo_ratio_mode == "geomean" else "prefix_sum"
        width = min(self.epsilon, self.epsilon_high)
        return (ClipWindow("prefix_clip", width, level, position_power=self.ctpo_position_power),)


class CTPOTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with the CTPO objective (cumulative prefix ratio, position-scaled log-space clip)."""

    config_class = CTPOConfig
    supports_delta = False
    inert_on_policy = "CTPO is exactly token-level GRPO"

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:  # fmt: skip
        args = self.args
        return ctpo_loss(
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            dual_clip=args.ctpo_dual_clip,
            position_power=args.ctpo_position_power,
            ratio_mode=args.ctpo_ratio_mode,
        )
