"""GRPO-fix: symmetric clipping of the token ratio for both advantage signs (Ding et al., arXiv:2604.13088,
App. H, Eq. 79-80); `DFPOTrainer` runs it as ``dfpo_transform="symmetric_clip"``. Derivation in docs/dfpo.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from .common import (
    ObjectiveOutput,
    as_token_advantages,
    check_positive,
    check_token_inputs,
    compute_dtype,
    masked_sum,
    named,
    names_of,
    nan_if_empty,
)

__all__ = ["symmetric_clip_loss", "validate_grpo_fix"]


def validate_grpo_fix(
    *, epsilon_high: float, orthogonal_over: str = "all", names: Mapping[str, str] | None = None
) -> None:
    """Raise unless the upper clip ``1 + epsilon_high`` has a finite width > 0, and ``orthogonal_over`` is left at
    ``"all"``: GRPO-fix clips each token on its own, with no in-group constraint to restrict (`DFPOConfig` runs it
    once; `names`: see `common.named`)."""
    check_positive(**named(names, epsilon_high=epsilon_high), finite=True)
    if orthogonal_over != "all":
        (over_name,) = names_of(names, "orthogonal_over")
        raise ValueError(
            f"{over_name}={orthogonal_over!r} needs one of DFPO's in-group transforms, not GRPO-fix "
            "(dfpo_transform='symmetric_clip', which clips each token on its own): leave it 'all'."
        )


def symmetric_clip_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_high: float,
    importance_weights: Tensor | None = None,
) -> ObjectiveOutput:
    """GRPO-fix: token-level ``-A * clip(r, 0, 1 + eps_high)`` for both advantage signs (Eq. 79-80): the clip alone,
    not PPO's ``min(rA, clip(r) A)`` (App. H.3), so a token with ``r > 1 + eps`` gets no gradient whatever the sign of
    ``A``; Eq. 80's ``1/G sum_i sum_t`` is the trainer's ``loss_type``; no lower clip (Eq. 79's 0 never binds).

    ``per_token_logps``, ``old_per_token_logps`` (constant), ``mask``: (B, T); ``advantages``: (B,), (B, 1) or (B, T);
    ``importance_weights``: TRL's per-token loss weights, (B, 1) or (B, T) or None, multiplied after the clip as TRL
    does (not again by the caller). Returns per_token_loss (B, T) before masking; metrics ``clip_ratio/high`` (B, T)
    ``r > 1 + eps_high`` with ``A > 0`` (TRL's semantics), ``clip_ratio/low`` 0, ``clip_ratio/region`` either, and
    ``dfpo/sym_clip_ratio``: the fraction of valid tokens with ``r > 1 + eps_high`` for any sign (every token whose
    gradient the clip removes).
    """
    check_token_inputs(per_token_logps, old_per_token_logps, mask)
    batch, length = per_token_logps.shape
    adv = as_token_advantages(advantages)  # (B, 1) or (B, T)
    if adv.shape[0] != batch or adv.shape[1] not in (1, length):
        raise ValueError(
            f"advantages must be ({batch},), ({batch}, 1) or ({batch}, {length}), got shape {tuple(advantages.shape)}"
        )

    dtype = compute_dtype(per_token_logps, old_per_token_logps)
    logp = per_token_logps.to(dtype)  # (B, T)
    old_logp = old_per_token_logps.detach().to(dtype)  # (B, T)
    mask_f = mask.to(dtype)  # (B, T)
    adv = adv.detach().to(dtype)  # (B, 1) or (B, T)

    log_ratio = (logp - old_logp) * mask_f  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) r
    upper = 1.0 + epsilon_high
    phi = torch.clamp(ratio, min=0.0, max=upper)  # (B, T) Eq. 79, same for both signs of A
    per_token_loss = -adv * phi  # (B, T) Eq. 80 (negated for minimisation)
    if importance_weights is not None:  # mirrors GRPOTrainer._compute_loss: loss * importance_sampling_ratio
        per_token_loss = per_token_loss * importance_weights.detach().to(dtype)

    with torch.no_grad():
        above = (ratio > upper).to(dtype)  # (B, T)
        high = above * (adv.expand_as(ratio) > 0).to(dtype)  # (B, T)
        count = mask_f.sum()
        metrics = {
            # per-token indicators (reduced token-weighted over processes by the trainer); no lower bound, low is 0
            "clip_ratio/low": torch.zeros_like(high, dtype=torch.float32) * mask_f,  # (B, T)
            "clip_ratio/high": (high * mask_f).float(),  # (B, T)
            "clip_ratio/region": (high * mask_f).float(),  # (B, T)
            "dfpo/sym_clip_ratio": nan_if_empty(masked_sum(above, mask_f) / count.clamp(min=1), count),
        }
    return ObjectiveOutput(per_token_loss=per_token_loss, metrics=metrics)
