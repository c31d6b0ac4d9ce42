"""CTPO: cumulative token importance ratio with position-adaptive log-space clipping.

Zhang, Ye, Jin, Yu, Xiong, Sahu, Jiang, "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative
Token Perspective", arXiv:2605.07331. The loss is the authors' `cum-token-cumprod-la` / `cum-token-geomean-la`
(github.com/horizon-llm/CTPO); equations in `trl_groupopt.objectives.ctpo`, derivations in docs/ctpo.md.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from trl import GRPOConfig

from ..objectives.common import ObjectiveOutput
from ..objectives.ctpo import RATIO_MODES, ctpo_loss
from ..registry import register_method
from .base import GroupOptTrainer, TokenSafeConfigMixin
from .schedule import default_off_policy_schedule

# The authors' schedule (ctpo.sh): a 512-prompt rollout trained in mini-batches of 32 prompts, 16 steps per rollout.
CTPO_UPDATES_PER_ROLLOUT = 16
# The authors' recommended position power per ratio mode (core_algos.py): the log prefix ratio's spread grows like
# sqrt(t), its per-token mean's shrinks like 1/sqrt(t).
DEFAULT_POSITION_POWER = {"cumprod": 0.5, "geomean": -0.5}


@dataclass(repr=False)
class CTPOConfig(TokenSafeConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`CTPOTrainer`].

    Inherits every parameter of [`trl.GRPOConfig`]. The defaults below are the authors' (`ctpo.sh` in
    github.com/horizon-llm/CTPO): `epsilon` and `epsilon_high` are *log-space* bounds per unit of `t**p`, i.e. the
    cumulative log ratio at valid position `t` is clipped to `[-epsilon * t**p, epsilon_high * t**p]`.

    Schedule. CTPO's clips only act off-policy (on-policy it is token-level GRPO). When none of
    `steps_per_generation`, `generation_batch_size` and `num_iterations` is set, CTPOConfig uses the authors' 16
    optimizer steps per rollout (512 prompts per rollout, mini-batches of 32): `steps_per_generation =
    16 * gradient_accumulation_steps`, `num_iterations = 1`, so the generation batch is 16 effective training batches.
    Set any of the three to choose another schedule; an on-policy one makes the trainer warn.

    Parameters:
        epsilon (`float`, *optional*, defaults to `0.025`):
            Lower log-space clip bound per unit of `t**p`.
        epsilon_high (`float`, *optional*, defaults to `0.05`):
            Upper log-space clip bound per unit of `t**p`.
        ctpo_dual_clip (`float`, *optional*, defaults to `0.05`):
            Dual-clip bound for negative advantages: the loss of a token with `A < 0` is capped at
            `-A * exp(ctpo_dual_clip * t**p)`.
        ctpo_ratio_mode (`str`, *optional*, defaults to `"cumprod"`):
            `"cumprod"`: the prefix ratio `prod_{j<=t} r_j` (the authors' `cum-token-cumprod-la`); `"geomean"`: its
            geometric mean `exp(L_t / t)` (`cum-token-geomean-la`).
        ctpo_position_power (`float`, *optional*):
            `p` in the position scaling `t**p`. Defaults to the authors' recommendation for the mode: `0.5` (sqrt(t))
            for `"cumprod"`, `-0.5` for `"geomean"`. Must be >= 0 for `"cumprod"` (0: constant window).
        vllm_importance_sampling_mode (`str`, *optional*, defaults to `"sequence_truncate"`):
            TRL's vLLM correction, with the authors' rollout correction as default: sequence-level truncated IS.
        vllm_importance_sampling_clip_max (`float`, *optional*, defaults to `5.0`):
            The authors' truncation cap (TRL's default is 3.0).
        num_iterations (`int`, *optional*):
            TRL's `num_iterations`; unset means 1 (and, with `steps_per_generation` unset, the schedule above).
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
    num_iterations: int | None = field(
        default=None, metadata={"help": "Iterations per generation batch; unset: 1 (see the default schedule)."}
    )
    loss_type: str = field(default="dapo", metadata={"help": "Aggregation; the authors use token-mean (dapo)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; the authors use none."})

    def __post_init__(self):
        default_off_policy_schedule(self, CTPO_UPDATES_PER_ROLLOUT)
        super().__post_init__()
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        for name in ("epsilon", "epsilon_high", "ctpo_dual_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 for CTPO (a log-space bound), got {getattr(self, name)}.")
        if self.ctpo_ratio_mode not in RATIO_MODES:
            raise ValueError(f"ctpo_ratio_mode must be one of {RATIO_MODES}, got {self.ctpo_ratio_mode!r}.")
        if self.ctpo_position_power is None:
            self.ctpo_position_power = DEFAULT_POSITION_POWER[self.ctpo_ratio_mode]
        power = self.ctpo_position_power
        if not math.isfinite(power) or (self.ctpo_ratio_mode == "cumprod" and power < 0):
            raise ValueError(
                f"ctpo_position_power must be >= 0 with ctpo_ratio_mode='cumprod' (0.5 = the paper's sqrt(t)), got "
                f"{power}. Negative powers (the authors' -0.5) go with ctpo_ratio_mode='geomean'."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "CTPO builds its own cumulative (prefix) ratio from token log-ratios: set importance_sampling_level="
                f"'token' (got {self.importance_sampling_level!r})."
            )


class CTPOTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with the CTPO objective (cumulative prefix ratio, position-scaled log-space clip)."""

    config_class = CTPOConfig
    _tag_names = ["trl", "ctpo", "trl-groupopt"]
    _name = "CTPO"
    _paper = {
        "title": "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective",
        "id": "2605.07331",
        "citation": textwrap.dedent("""\
            @article{zhang2026ctpo,
                title        = {{Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective}},
                author       = {Zhang and Ye and Jin and Yu and Xiong and Sahu and Jiang},
                year         = 2026,
                eprint       = {arXiv:2605.07331},
                howpublished = {\\url{https://github.com/horizon-llm/CTPO}},
            }"""),
    }
    supports_delta = False
    inert_on_policy_fix = (
        "CTPO is exactly token-level GRPO. Leave steps_per_generation, generation_batch_size and num_iterations unset "
        "(CTPOConfig then uses 16 optimizer steps per rollout), or set steps_per_generation to a multiple k > 1 of "
        "gradient_accumulation_steps (or num_iterations > 1)."
    )

    def objective(
        self,
        per_token_logps: Tensor,
        old_per_token_logps: Tensor,
        advantages: Tensor,
        mask: Tensor,
        inputs: dict[str, Any],
    ) -> ObjectiveOutput:
        return ctpo_loss(
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            epsilon_low=self.args.epsilon,
            epsilon_high=self.args.epsilon_high,
            epsilon_c=self.args.ctpo_dual_clip,
            position_power=self.args.ctpo_position_power,
            ratio_mode=self.args.ctpo_ratio_mode,
        )


register_method(
    "ctpo",
    config_class=CTPOConfig,
    trainer_class=CTPOTrainer,
    paper="arXiv:2605.07331",
    headline_metric="ctpo/dual_clip",
    summary="cumulative-prefix token ratio with position-adaptive log-space clipping",
)
