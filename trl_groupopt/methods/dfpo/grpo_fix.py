"""GRPO-fix: symmetric clipping of the token ratio for both advantage signs (Ding et al., arXiv:2604.13088,
App. H, Eq. 79-80); `DFPOTrainer` runs it as ``dfpo_transform="symmetric_clip"``. Derivation in docs/dfpo.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...core.common import (
    ObjectiveOutput,
    as_token_advantages,
    check_token_inputs,
    clip_indicators,
    compute_dtype,
    masked_mean,
    nan_if_empty,
)

__all__ = ["symmetric_clip_loss"]


def symmetric_clip_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_high: float,
    importance_weights: Tensor | None = None,
) -> ObjectiveOutput:
    """GRPO-fix: token-level ``-A * clip(r, 0, 1 + eps_high)`` for both signs of A (Eq. 79-80; not PPO's min, App. H.3):
    no gradient where ``r > 1 + eps``; Eq. 80's ``1/G sum_i sum_t`` is the trainer's ``loss_type``. TRL's loss
    weights multiply after the clip, as TRL does. Metrics: TRL's clip indicators (high: ``r > 1 + eps_high`` with
    ``A > 0``; low: 0) and ``dfpo/sym_clip_ratio``, the fraction of valid tokens with ``r > 1 + eps_high``.
    """
    check_token_inputs(per_token_logps, old_per_token_logps, mask, advantages)
    dtype = compute_dtype(per_token_logps, old_per_token_logps)
    mask_f = mask.to(dtype)  # (B, T)
    adv = as_token_advantages(advantages).detach().to(dtype)  # (B, 1) or (B, T)

    log_ratio = (per_token_logps.to(dtype) - old_per_token_logps.detach().to(dtype)) * mask_f  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) r
    upper = 1.0 + epsilon_high
    phi = torch.clamp(ratio, min=0.0, max=upper)  # (B, T) Eq. 79, same for both signs of A
    per_token_loss = -adv * phi  # (B, T) Eq. 80 (negated for minimisation)
    if importance_weights is not None:  # mirrors GRPOTrainer._compute_loss (trl 1.16.0): loss * IS weights
        per_token_loss = per_token_loss * importance_weights.detach().to(dtype)

    above = (ratio > upper).to(dtype)  # (B, T) a comparison: no gradient
    high = above * (adv > 0) * mask_f  # (B, T) valid tokens above the bound with A > 0
    metrics = clip_indicators(torch.zeros_like(high), high)  # (B, T) each; no lower bound, low is 0
    metrics["dfpo/sym_clip_ratio"] = nan_if_empty(masked_mean(above, mask_f), mask_f.sum())
    return ObjectiveOutput(per_token_loss=per_token_loss, metrics=metrics)
