"""`reduce_metrics`: an objective's metrics as 0-dim values on one micro-batch, the reduction the trainer does over
all processes (`trl_groupopt/trainer/metrics.py`), for the objective tests."""

from __future__ import annotations

import torch
from torch import Tensor

from trl_groupopt.core.common import masked_mean, nan_if_empty


def clip_fraction(indicator: Tensor, mask: Tensor) -> Tensor:
    """Fraction of valid tokens flagged by a per-token (B, T) clip indicator, or of sequences for a (B, 1) one.

    Objectives return their `clip_ratio/*` metrics as detached 0/1 indicators so the trainer can reduce them over
    processes token-weighted, exactly as TRL does; this is the same reduction on one micro-batch. NaN when empty.
    """
    if indicator.shape == mask.shape:
        mask = mask.to(torch.float32)
        count = mask.sum()
        return nan_if_empty(masked_mean(indicator.float(), mask), count)
    count = torch.tensor(float(indicator.numel()))
    return nan_if_empty(indicator.float().sum() / count.clamp(min=1.0), count)


def reduce_metrics(metrics: dict[str, Tensor], mask: Tensor) -> dict[str, Tensor]:
    """An objective's metrics as 0-dim values for one micro-batch: clip indicators become fractions (`clip_fraction`),
    scalars pass through. The trainer does the same reduction over all processes."""
    return {name: clip_fraction(value, mask) if value.dim() == 2 else value for name, value in metrics.items()}
