"""DFPO's logged diagnostics (arXiv:2604.13088, Eq. 23 and 87; the cancellation residual is ours, docs/dfpo.md), from
`dfpo_loss`'s `SequenceWeights` where they are logged (`DFPOTrainer.objective`), never inside the loss."""

from __future__ import annotations

import torch
from torch import Tensor

from ...core.common import Groups, nan_if_empty
from .objective import SequenceWeights, both_signs

__all__ = ["dfpo_diagnostics"]


def dfpo_diagnostics(weights: SequenceWeights, loss_type: str = "dapo") -> dict[str, Tensor]:
    """0-dim detached metrics of one `dfpo_loss` call (its output's `weights`, detached), defined in docs/dfpo.md,
    Metrics: Eq. 23's asymmetry before / after the transform, Eq. 87's mean shrink, and the cancellation residual of
    ``s_til`` and of GSPO's ``s_bar w_IS`` on the same batch; each NaN for an empty batch."""
    adv, groups, s_til, effective = weights.advantages, weights.groups, weights.s_til, weights.effective
    informative = weights.members & both_signs(torch.where(weights.members, adv, torch.zeros_like(adv)), groups)
    shrink = s_til / effective.clamp_min(torch.finfo(s_til.dtype).tiny)  # (B,) Eq. 87
    count = informative.sum()
    return {
        "dfpo/asym_before": _mean_group_variance(effective * adv, groups).float(),
        "dfpo/asym_after": _mean_group_variance(s_til * adv, groups).float(),
        "dfpo/shrink": nan_if_empty(torch.where(informative, shrink, 0.0).sum() / count.clamp(min=1), count),
        "dfpo/cancellation_residual": _cancellation_residual(weights, s_til, loss_type),
        # the same for GSPO's untransformed weights on this batch: what the transform is measured against
        "dfpo/cancellation_residual_gspo": _cancellation_residual(weights, effective, loss_type),
    }


def _mean_group_variance(values: Tensor, groups: Groups) -> Tensor:
    """Mean over groups of the population variance of ``values`` within each group (Eq. 23), in float64 saturated at
    float32's largest value: an unclipped ratio of e^50 (A < 0 keeps large ratios, Eq. 47) squares to ~1e43."""
    values = values.double()
    centred = values - groups.rows(values, "mean")  # (B,)
    variance = groups.reduce(centred * centred, "mean")  # (K,)
    return variance.mean().clamp(max=torch.finfo(torch.float32).max)


def _cancellation_residual(weights: SequenceWeights, s_til: Tensor, loss_type: str) -> Tensor:
    """0-dim mean over groups of ``|sum_i A_i c_i| / sum_i |A_i| c_i`` in float64, ``c_i`` the coefficient of
    ``grad log p`` at a token of sequence ``i`` up to a batch constant: ``s_til_i``, times ``1 / |y_i|`` under
    ``loss_type="grpo"`` (a token sum does not undo Eq. 44's sequence mean). Only members that carry gradient count.
    """
    adv, s_til, groups = weights.advantages.double(), s_til.double(), weights.groups
    coef = s_til / weights.lengths.double().clamp(min=1.0) if loss_type == "grpo" else s_til  # (B,)
    moving = weights.carries & (adv != 0) & (coef > 0)  # (B,) members whose gradient is not zero
    signed = groups.reduce(torch.where(moving, adv * coef, 0.0), "sum")  # (K,)
    total = groups.reduce(torch.where(moving, adv.abs() * coef, 0.0), "sum")  # (K,)
    count = groups.reduce(moving.double(), "sum")  # (K,)
    keep = (count >= 2) & (total > 0)  # (K,)
    residual = signed.abs() / total.clamp(min=torch.finfo(torch.float64).tiny)  # (K,)
    kept = keep.sum()
    return nan_if_empty(torch.where(keep, residual, 0.0).sum() / kept.clamp(min=1), kept)
