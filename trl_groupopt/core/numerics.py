"""The forward's numerical noise against a clip window, as pure functions of (B, T) tensors (no trainer).

On the first optimizer step of a rollout the policy has not moved since the behaviour forward, so every token
log-ratio there, ``x = logp - old_logp``, is numerical noise: two forwards of the same weights over differently
composed batches (bf16 matmuls round differently). An objective clips some function of ``x`` (the token log-ratio,
a sequence's mean, a prefix's sum, the batch's mean) against a bound; :func:`noise_share` is the rms of that function
of the noise over its bound, in the objective's own terms (docs/ctpo.md and docs/dfpo.md, "Numerical noise")."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["CLIP_LEVELS", "ClipWindow", "clipped_by_noise", "log_ratio_rms", "noise_share", "ratio_window_width"]

#: What a window clips: the token log-ratio, a sequence's mean log-ratio (GSPO's sequence ratio), the mean over the
#: whole micro-batch, a prefix's cumulative sum or the mean of that prefix sum (its bound scaled by ``t**power``).
CLIP_LEVELS = ("token", "sequence", "batch", "prefix_sum", "prefix_mean")


@dataclass(frozen=True)
class ClipWindow:
    """One clip of an objective: ``name`` (the metric's suffix, e.g. "token_clip"), ``width`` (its narrower
    half-width in log-ratio units; for the prefix levels, per unit of ``t**position_power``) and ``level``."""

    name: str
    width: float
    level: str = "token"
    position_power: float = 0.0

    def __post_init__(self) -> None:
        if self.level not in CLIP_LEVELS:
            raise ValueError(f"ClipWindow.level must be one of {CLIP_LEVELS}, got {self.level!r}.")
        if not self.width > 0:
            raise ValueError(f"ClipWindow.width must be > 0, got {self.width}.")


def ratio_window_width(epsilon_low: float, epsilon_high: float) -> float:
    """The narrower log-space half-width of the ratio window ``[1 - epsilon_low, 1 + epsilon_high]`` (inf for a side
    that does not bound: ``epsilon_low >= 1``)."""
    low = -math.log1p(-epsilon_low) if epsilon_low < 1 else math.inf
    return min(low, math.log1p(epsilon_high))


def log_ratio_rms(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """0-dim float32 rms of the (B, T) token log-ratios over the mask (0 for an empty mask)."""
    x, m = _noise(log_ratio, mask)
    return ((x * x).sum() / m.sum().clamp(min=1.0)).sqrt().float()


def noise_share(log_ratio: Tensor, mask: Tensor, window: ClipWindow) -> Tensor:
    """0-dim float32 rms of ``q / bound`` over the window's clipped quantities ``q`` (one per token, sequence or
    micro-batch), where ``q`` is what the objective clips computed from the noise ``log_ratio``: 1 means the noise
    alone is as large as the window; 0 for an empty mask."""
    scaled, weight = _scaled_quantities(log_ratio, mask, window)
    return ((scaled * scaled * weight).sum() / weight.sum().clamp(min=1.0)).sqrt().float()


def clipped_by_noise(log_ratio: Tensor, mask: Tensor, window: ClipWindow) -> Tensor:
    """0-dim float32 share of the window's clipped quantities beyond the bound on one side, when ``log_ratio`` is pure
    noise (where the policy has not moved nothing should clip: each is a clip decision the noise made)."""
    scaled, weight = _scaled_quantities(log_ratio, mask, window)
    return (((scaled.abs() > 1).to(weight.dtype) * weight).sum() / weight.sum().clamp(min=1.0)).float()


def _scaled_quantities(log_ratio: Tensor, mask: Tensor, window: ClipWindow) -> tuple[Tensor, Tensor]:
    """(the window's clipped quantities over their bound, their weights: 1 where one exists), float64."""
    x, m = _noise(log_ratio, mask)
    if window.level == "token":
        q, weight = x, m
    elif window.level in ("sequence", "batch"):
        dims = -1 if window.level == "sequence" else (0, 1)
        q, weight = x.sum(dims) / m.sum(dims).clamp(min=1.0), (m.sum(dims) > 0).to(x.dtype)
    else:  # prefix_sum / prefix_mean: the bound is width * t**power at the t-th valid token
        t = m.cumsum(-1).clamp(min=1.0)  # (B, T)
        q = x.cumsum(-1) / (t if window.level == "prefix_mean" else 1.0)  # (B, T)
        q, weight = q / t**window.position_power, m
    return q / window.width, weight


def _noise(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T) log-ratios in float64, 0 off the mask (where padding may hold non-finite values), and the mask."""
    m = mask.detach().to(torch.float64)
    return torch.where(mask.bool(), log_ratio.detach().to(torch.float64), 0.0), m
