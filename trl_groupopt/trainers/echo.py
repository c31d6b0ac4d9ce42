"""ECHO: clip at batch, learn at token (batch-level clipping with token-level importance sampling).

Paper: "ECHO: Efficient Coarse-grained Hybrid Optimization — Clip at Batch, Learn at Token" (under review; the copy we
implement is in the repo's shared papers). Equations in `trl_groupopt.objectives.echo`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from trl import GRPOConfig

from ..objectives.common import ObjectiveOutput
from ..objectives.echo import echo_batch_ratio_coupling, echo_loss
from ..registry import register_method
from .base import GroupOptTrainer, TokenSafeConfigMixin

BATCH_RATIO_SCOPES = ("micro_batch", "global")
# Loss types whose normaliser is one constant shared by every process: the only ones for which the "global" scope's
# cross-process gradient completion is exact (see objectives/echo.py).
GLOBAL_SCOPE_LOSS_TYPES = ("dapo", "dr_grpo")


@dataclass(repr=False)
class ECHOConfig(TokenSafeConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`ECHOTrainer`].

    Inherits every parameter of [`trl.GRPOConfig`]. ECHO clips the geometric batch ratio
    `R = exp(mean of the token log-ratios)` to `[1 - batch_epsilon, 1 + batch_epsilon_high]` (Eq. 7) and scales every
    token ratio by `clip(R) / sg(R)` (Eq. 8), then applies the usual token clip with `epsilon`/`epsilon_high`
    (Eq. 11). The paper uses one epsilon for both clips, hence the defaults.

    Batch clipping only acts off-policy (`steps_per_generation > gradient_accumulation_steps` or `num_iterations > 1`);
    on-policy, ECHO still differs from DAPO through the batch-coupling term of its gradient (Eq. 34).

    Parameters:
        batch_epsilon (`float`, *optional*):
            Lower batch clip `1 - batch_epsilon`. Defaults to `epsilon` (the paper's single epsilon).
        batch_epsilon_high (`float`, *optional*):
            Upper batch clip `1 + batch_epsilon_high`. Defaults to `batch_epsilon`.
        token_clip (`bool`, *optional*, defaults to `True`):
            Keep the token-level min/clip of Eq. 11. `False` trains with the batch clip alone (`-rho * A`).
        batch_ratio_scope (`str`, *optional*, defaults to `"micro_batch"`):
            Tokens that form R: `"micro_batch"` (this process's micro-batch; works with every option) or `"global"`
            (the micro-batches of all processes: R is all-reduced and each process's gradient is completed with the
            other processes' coupling, so N processes train exactly as one process on the union). `"global"` needs a
            loss type with one shared normaliser (`dapo`, `dr_grpo`) and no per-token loss multipliers
            (`top_entropy_quantile=1`, no `off_policy_mask_threshold`, no vLLM importance-sampling correction).
        loss_type (`str`, *optional*, defaults to `"dapo"`):
            `1 / sum|o_i|` token-mean aggregation (Eq. 11).
    """

    batch_epsilon: float | None = field(default=None, metadata={"help": "Lower batch clip; default: epsilon."})
    batch_epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper batch clip; default: batch_epsilon."}
    )
    token_clip: bool = field(default=True, metadata={"help": "Keep the token-level clip of Eq. 11."})
    batch_ratio_scope: str = field(default="micro_batch", metadata={"help": "micro_batch | global"})
    loss_type: str = field(default="dapo", metadata={"help": "Aggregation; ECHO uses token-mean (dapo)."})

    def __post_init__(self):
        super().__post_init__()
        if self.batch_epsilon is None:
            self.batch_epsilon = self.epsilon
        if self.batch_epsilon_high is None:
            self.batch_epsilon_high = self.batch_epsilon
        for name in ("epsilon", "epsilon_high", "batch_epsilon", "batch_epsilon_high"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}.")
        if self.batch_epsilon >= 1:
            raise ValueError(
                f"batch_epsilon must be < 1 (the lower batch bound is 1 - batch_epsilon), got {self.batch_epsilon} "
                "(it defaults to epsilon: set batch_epsilon explicitly if epsilon >= 1 is intended)."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "ECHO's ratios are token-level (Eq. 8-11): set importance_sampling_level='token' "
                f"(got {self.importance_sampling_level!r})."
            )
        if self.batch_ratio_scope not in BATCH_RATIO_SCOPES:
            raise ValueError(f"batch_ratio_scope must be one of {BATCH_RATIO_SCOPES}, got {self.batch_ratio_scope!r}.")
        if self.batch_ratio_scope == "global":
            problems = []
            if self.loss_type not in GLOBAL_SCOPE_LOSS_TYPES:
                problems.append(f"loss_type={self.loss_type!r} (use one of {GLOBAL_SCOPE_LOSS_TYPES})")
            if self.top_entropy_quantile < 1.0:
                problems.append("top_entropy_quantile < 1")
            if self.off_policy_mask_threshold is not None:
                problems.append("off_policy_mask_threshold")
            if self.use_vllm and self.vllm_importance_sampling_correction:
                problems.append("vllm_importance_sampling_correction=True")
            if problems:
                raise ValueError(
                    "batch_ratio_scope='global' is exact only with one shared loss normaliser and no per-token loss "
                    f"multipliers; incompatible: {', '.join(problems)}. Use batch_ratio_scope='micro_batch' or change "
                    "those settings."
                )


class ECHOTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with ECHO's objective: batch-level clip, token-level importance sampling."""

    config_class = ECHOConfig
    _tag_names = ["trl", "echo", "trl-groupopt"]
    _name = "ECHO"
    _paper = {
        "title": "ECHO: Efficient Coarse-grained Hybrid Optimization - Clip at Batch, Learn at Token",
        "id": None,
        "citation": textwrap.dedent("""\
            @misc{echo2025,
                title        = {{ECHO: Efficient Coarse-grained Hybrid Optimization - Clip at Batch, Learn at Token}},
                author       = {Anonymous},
                year         = 2025,
                note         = {Paper under double-blind review},
            }"""),
    }
    supports_delta = False

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:
        kwargs: dict[str, Any] = dict(
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            batch_epsilon_low=self.args.batch_epsilon,
            batch_epsilon_high=self.args.batch_epsilon_high,
            token_clip=self.args.token_clip,
        )
        if self.args.batch_ratio_scope == "global":
            log_r = (per_token_logps.detach() - old_per_token_logps) * mask  # (B, T)
            local = torch.stack([log_r.sum(), mask.sum()]).float()  # (2,) detached
            totals = self.accelerator.reduce(local, reduction="sum")  # (2,) over processes
            kwargs.update(log_ratio_sum=totals[0], token_count=totals[1])
            if self.accelerator.num_processes > 1:
                coupling = echo_batch_ratio_coupling(per_token_logps, old_per_token_logps, advantages, mask, **kwargs)
                kwargs["coupling_sum"] = self.accelerator.reduce(coupling.float().reshape(1), reduction="sum")[0]
        return echo_loss(per_token_logps, old_per_token_logps, advantages, mask, **kwargs)


register_method(
    "echo",
    config_class=ECHOConfig,
    trainer_class=ECHOTrainer,
    paper="ECHO (batch-level clipping, token-level IS)",
    headline_metric="echo/batch_clipped",
    summary="token ratios times clip(R)/sg(R), R the geometric batch ratio",
)
