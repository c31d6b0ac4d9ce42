"""CTPO: cumulative token importance ratio with position-adaptive log-space clipping.

Paper: "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective" (CTPO). The
formula follows the authors' public code (github.com/horizon-llm/CTPO, loss `cum-token-cumprod-la`), see
`trl_groupopt.objectives.ctpo`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from trl import GRPOConfig

from ..objectives.common import ObjectiveOutput
from ..objectives.ctpo import ctpo_loss
from ..registry import register_method
from .base import GroupOptTrainer, TokenSafeConfigMixin


@dataclass(repr=False)
class CTPOConfig(TokenSafeConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`CTPOTrainer`].

    Inherits every parameter of [`trl.GRPOConfig`]. The defaults below are the authors' (`ctpo.sh` in
    github.com/horizon-llm/CTPO): `epsilon` and `epsilon_high` are *log-space* bounds per unit of `t**p`, i.e. the
    cumulative log ratio at valid position `t` is clipped to `[-epsilon * t**p, epsilon_high * t**p]`.

    Parameters:
        epsilon (`float`, *optional*, defaults to `0.025`):
            Lower log-space clip bound per unit of `t**p`.
        epsilon_high (`float`, *optional*, defaults to `0.05`):
            Upper log-space clip bound per unit of `t**p`.
        ctpo_dual_clip (`float`, *optional*, defaults to `0.05`):
            Dual-clip bound for negative advantages: the loss of a token with `A < 0` is capped at
            `-A * exp(ctpo_dual_clip * t**p)`.
        ctpo_position_power (`float`, *optional*, defaults to `0.5`):
            `p` in the position scaling `t**p` (0.5 is the paper's sqrt(t); 0 gives the plain cumulative-ratio clip).
        loss_type (`str`, *optional*, defaults to `"dapo"`):
            Token-mean aggregation, as the authors.
        beta (`float`, *optional*, defaults to `0.0`):
            No KL term, as the authors.
    """

    epsilon: float = field(default=0.025, metadata={"help": "Lower log-space clip bound per unit of t**p."})
    epsilon_high: float | None = field(default=0.05, metadata={"help": "Upper log-space clip bound per unit of t**p."})
    ctpo_dual_clip: float = field(
        default=0.05, metadata={"help": "Dual clip for A < 0: loss capped at -A * exp(ctpo_dual_clip * t**p)."}
    )
    ctpo_position_power: float = field(
        default=0.5, metadata={"help": "Power p of the position scaling t**p of the clip bounds (0: constant)."}
    )
    loss_type: str = field(default="dapo", metadata={"help": "Aggregation; the authors use token-mean (dapo)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; the authors use none."})

    def __post_init__(self):
        super().__post_init__()
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        for name in ("epsilon", "epsilon_high", "ctpo_dual_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 for CTPO (a log-space bound), got {getattr(self, name)}.")
        if self.ctpo_position_power < 0:
            raise ValueError(
                f"ctpo_position_power must be >= 0 (0.5 = the paper's sqrt(t)), got {self.ctpo_position_power}."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "CTPO builds its own cumulative (prefix) ratio from token log-ratios: set importance_sampling_level="
                f"'token' (got {self.importance_sampling_level!r})."
            )


class CTPOTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with the CTPO objective (cumulative prefix ratio, sqrt(t)-scaled log-space clip)."""

    config_class = CTPOConfig
    _tag_names = ["trl", "ctpo", "trl-groupopt"]
    _name = "CTPO"
    _paper = {
        "title": "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective",
        "id": None,
        "citation": textwrap.dedent("""\
            @misc{ctpo2026,
                title        = {{Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective}},
                author       = {{CTPO authors}},
                year         = 2026,
                howpublished = {\\url{https://github.com/horizon-llm/CTPO}},
            }"""),
    }
    supports_delta = False

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:
        return ctpo_loss(
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            epsilon_low=self.args.epsilon,
            epsilon_high=self.args.epsilon_high,
            epsilon_c=self.args.ctpo_dual_clip,
            position_power=self.args.ctpo_position_power,
        )


register_method(
    "ctpo",
    config_class=CTPOConfig,
    trainer_class=CTPOTrainer,
    paper="arXiv:2605.07331",
    headline_metric="ctpo/dual_clip",
    summary="cumulative-prefix token ratio with position-adaptive log-space clipping",
)
