"""DFPO: in-group re-weighting of GSPO's sequence weights that restores token-gradient cancellation.

Paper: Ding et al., arXiv:2604.13088 (App. B-D, K; equation numbers are the paper's). The derivation, the reading of
each equation and every deviation from the paper are in ``docs/dfpo.md``. In short, per sequence ``i`` of a group::

    s_i     = exp( (1/|y_i|) sum_t log r_it )                      (44)  GSPO ratio, with gradient
    s_bar_i = min(s_i, clip(s_i)) if A_i >= 0 else max(...)        (46)-(47)  sign-aware post-clip
    e_i     = s_bar_i * w_i                                        w_i: the trainer's loss weight (1: none)
    s_til   = T(sg(e), A) over the members M of each group         (50) min_replace, (52)-(55) orth_proj, (51) QP
    loss_i  = -A_i * sg(s_til_i / s_bar_i) * s_bar_i               phi-form, App. C/K

so every transform but ``"none"`` (TRL's GSPO) makes ``sum_{i in M} A_i s_til_i = 0``: a token shared by the group
gets no gradient under a loss_type that weighs every token alike (``"dapo"``, not ``"grpo"``). ``M``: the whole group
(``orthogonal_over="all"``, the paper's) or its members that carry gradient (``"unclipped"``, exact under clipping).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ...core.common import (
    Groups,
    ObjectiveOutput,
    check_token_inputs,
    checked_token_weights,
    clip_indicators,
    compute_dtype,
    log_importance_weights,
    masked_mean,
)

#: The in-group transforms of the post-clip weights (the one list of names; the trainer imports it).
TRANSFORMS: tuple[str, ...] = ("none", "min_replace", "orth_proj", "orth_proj_qp")
#: Which members of a group the orthogonality constraint ranges over (see `dfpo_loss`).
ORTHOGONAL_OVER: tuple[str, ...] = ("all", "unclipped")
#: The transforms that can enforce ``sum_i A_i s_til_i = 0`` over an arbitrary subset of a group.
SUBSET_TRANSFORMS: tuple[str, ...] = ("orth_proj", "orth_proj_qp")


def both_signs(adv: Tensor, groups: Groups) -> Tensor:
    """(B,) bool: the element's group holds a positive and a negative advantage."""
    has_pos = groups.reduce((adv > 0).to(adv.dtype), "amax") > 0  # (K,)
    has_neg = groups.reduce((adv < 0).to(adv.dtype), "amax") > 0  # (K,)
    return groups.broadcast(has_pos & has_neg)


def _orth_proj(s_bar: Tensor, adv: Tensor, groups: Groups, floor: float) -> Tensor:
    """Truncate-and-rebalance (Eq. 52-55, beta with the corrected sign) and the floor guard, see docs/dfpo.md."""
    tiny = torch.finfo(s_bar.dtype).tiny

    s_plus = s_bar.clamp_min(floor)  # (B,) Eq. 52
    is_pos, is_neg = adv > 0, adv < 0  # (B,) P and N
    has_pos = groups.rows(is_pos.to(s_bar.dtype), "sum") > 0  # (B,) group has a member in P
    has_neg = groups.rows(is_neg.to(s_bar.dtype), "sum") > 0  # (B,)
    mass_pos = groups.rows(torch.where(is_pos, adv * s_plus, 0.0), "sum")  # (B,) sum_P A s+
    mass_neg = groups.rows(torch.where(is_neg, -adv * s_plus, 0.0), "sum")  # (B,) sum_N -A s+
    delta = mass_pos - mass_neg  # (B,) Eq. 53

    # Eq. 55 (beta's sign corrected). delta > 0 implies mass_pos > 0, delta < 0 mass_neg > 0;
    # the clamps only keep the unused branch finite.
    alpha = mass_neg / mass_pos.clamp_min(tiny)  # (B,) in [0, 1) where delta > 0
    beta = mass_pos / mass_neg.clamp_min(tiny)  # (B,) in [0, 1) where delta < 0
    scale_pos = torch.where(delta > 0, alpha, 1.0)  # (B,) Eq. 54
    scale_neg = torch.where(delta < 0, beta, 1.0)  # (B,)

    # Floor guard (mixed-sign groups only): if the shrunk side would dip below the floor, shrink it
    # only until its smallest member reaches the floor and scale the other side up to rebalance.
    min_pos = groups.rows(torch.where(is_pos, s_plus, float("inf")), "amin")  # (B,) inf if P empty
    min_neg = groups.rows(torch.where(is_neg, s_plus, float("inf")), "amin")  # (B,)
    mixed = has_pos & has_neg  # (B,)
    guard_pos = mixed & (delta > 0) & (alpha * min_pos < floor)  # (B,)
    guard_neg = mixed & (delta < 0) & (beta * min_neg < floor)  # (B,)
    k_pos = floor / min_pos.clamp_min(tiny)  # (B,) <= 1 since min_pos >= floor
    k_neg = floor / min_neg.clamp_min(tiny)  # (B,)
    scale_pos = torch.where(guard_pos, k_pos, scale_pos)
    scale_neg = torch.where(guard_pos, k_pos * mass_pos / mass_neg.clamp_min(tiny), scale_neg)
    scale_neg = torch.where(guard_neg, k_neg, scale_neg)
    scale_pos = torch.where(guard_neg, k_neg * mass_neg / mass_pos.clamp_min(tiny), scale_pos)

    s_til = torch.where(is_pos, s_plus * scale_pos, torch.where(is_neg, s_plus * scale_neg, s_plus))
    # Mixed / all-zero groups: >= floor exactly (the guard can land one ulp under it).
    # Single-sign groups: the non-zero-advantage members are 0 (alpha or beta = 0), see docstring.
    keep_floor = mixed | (~has_pos & ~has_neg)  # (B,)
    return torch.where(keep_floor, s_til.clamp_min(floor), s_til)


def _orth_proj_qp(s_bar: Tensor, adv: Tensor, groups: Groups) -> Tensor:
    """Exact solution of Eq. 51 per group via the sorted KKT breakpoints (docs/dfpo.md)."""
    size = groups.size
    inf = float("inf")
    tiny = torch.finfo(s_bar.dtype).tiny

    dense_adv = groups.dense(adv)  # (K, G)
    dense_s = groups.dense(s_bar)  # (K, G)
    active = dense_adv != 0  # (K, G) A = 0 has no breakpoint
    safe_adv = torch.where(active, dense_adv, torch.ones_like(dense_adv))  # (K, G)
    breaks = torch.where(active, dense_s / safe_adv, torch.full_like(dense_s, inf))  # (K, G)

    breaks, perm = torch.sort(breaks, dim=1)  # (K, G) ascending, inactive (+inf) last
    a_sorted = dense_adv.gather(1, perm)  # (K, G)
    as_sorted = a_sorted * dense_s.gather(1, perm)  # (K, G) A_i s_i
    aa_sorted = a_sorted * a_sorted  # (K, G) A_i^2
    is_pos, is_neg = a_sorted > 0, a_sorted < 0  # (K, G)
    num_breaks = active.sum(1)  # (K,)

    def prefix(x: Tensor) -> Tensor:  # (K, G) -> (K, G + 1): sum over sorted idx < j
        return torch.cat([torch.zeros_like(x[:, :1]), torch.cumsum(x, 1)], dim=1)

    def suffix(x: Tensor) -> Tensor:  # (K, G) -> (K, G + 1): sum over sorted idx >= j
        # summed directly, not as total - prefix, which cancels catastrophically when a small term
        # follows large ones
        tail = torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1])
        return torch.cat([tail, torch.zeros_like(x[:, :1])], dim=1)

    # Piece j = (b_(j-1), b_(j)): active are N members left of it (idx < j) and P members right of
    # it (idx >= j), where g(lam) = c0_j - lam c1_j.
    c0 = prefix(torch.where(is_neg, as_sorted, 0.0)) + suffix(torch.where(is_pos, as_sorted, 0.0))  # (K, G + 1)
    c1 = prefix(torch.where(is_neg, aa_sorted, 0.0)) + suffix(torch.where(is_pos, aa_sorted, 0.0))  # (K, G + 1)

    valid = torch.arange(size, device=s_bar.device) < num_breaks.unsqueeze(1)  # (K, G)
    finite_breaks = torch.where(valid, breaks, torch.zeros_like(breaks))  # (K, G)
    g_at_break = c0[:, :-1] - finite_breaks * c1[:, :-1]  # (K, G) g(b_k), from piece k
    crossed = (g_at_break <= 0) & valid  # (K, G)
    first = crossed.to(torch.int64).argmax(1)  # (K,) first index where g <= 0 (argmax: first max)
    piece = torch.where(crossed.any(1), first, num_breaks)  # (K,) root lies on this piece

    c0_p = c0.gather(1, piece.unsqueeze(1)).squeeze(1)  # (K,)
    c1_p = c1.gather(1, piece.unsqueeze(1)).squeeze(1)  # (K,)
    last = max(size - 1, 0)
    left = breaks.gather(1, (piece - 1).clamp(0, last).unsqueeze(1)).squeeze(1)  # (K,)
    right = breaks.gather(1, piece.clamp(0, last).unsqueeze(1)).squeeze(1)  # (K,)
    has_left = piece > 0  # (K,)
    has_right = piece < num_breaks  # (K,)
    lo = torch.where(has_left, left, torch.full_like(left, -inf))  # (K,)
    hi = torch.where(has_right, right, torch.full_like(right, inf))  # (K,)
    # g linear on the piece: exact root c0 / c1, clamped into the piece against rounding. If g is
    # flat there (c1 = 0: single-sign or all-zero group) any point of the piece works; take a
    # finite end (or 0 for a group without breakpoints, where v = s_bar).
    root = torch.minimum(torch.maximum(c0_p / c1_p.clamp_min(tiny), lo), hi)  # (K,)
    flat = torch.where(has_right, hi, torch.where(has_left, lo, torch.zeros_like(lo)))  # (K,)
    lam = torch.where(c1_p > 0, root, flat)  # (K,)

    return (s_bar - groups.broadcast(lam) * adv).clamp_min(0.0)  # (B,) KKT: v = max(s_bar - lam A, 0)


def group_transform(
    s_bar: Tensor,
    advantages: Tensor,
    groups: Groups,
    method: str,
    *,
    orth_floor: float = 1e-6,
    members: Tensor | None = None,
) -> Tensor:
    """In-group transform of the post-clip sequence weights (Eq. 50, 51, 52-55), detached: (B,) ``s_til`` from (B,)
    ``s_bar`` >= 0 and ``advantages``, over the ``members`` rows (the others unchanged). A group whose advantages do
    not take both signs gets 0 where ``A != 0`` (docs/dfpo.md, Degenerate groups)."""
    if s_bar.dim() != 1 or advantages.shape != s_bar.shape:
        raise ValueError(f"s_bar and advantages must be (B,), got {tuple(s_bar.shape)}, {tuple(advantages.shape)}")
    groups = groups.covering(s_bar.shape[0])
    dtype = compute_dtype(s_bar, advantages)
    s = s_bar.detach().to(dtype)  # (B,)
    if s.numel() == 0 or method == "none":
        return s.clone()
    members = torch.ones_like(s, dtype=torch.bool) if members is None else members.to(s.device)
    adv = torch.where(members, advantages.detach().to(dtype), torch.zeros_like(s))  # (B,) non-members: no constraint
    if method == "min_replace":
        group_minimum = groups.rows(torch.where(members, s, torch.full_like(s, float("inf"))), "amin")  # (B,) Eq. 50
        out = torch.where(both_signs(adv, groups) | (adv == 0), group_minimum, torch.zeros_like(s))
    elif method == "orth_proj":
        out = _orth_proj(s, adv, groups, float(orth_floor))  # (B,) Eq. 52-55
    elif method == "orth_proj_qp":
        out = _orth_proj_qp(s, adv, groups)  # (B,) Eq. 51
    else:
        raise ValueError(f"unknown transform {method!r}; use one of {TRANSFORMS}")
    return torch.where(members, out, s)


class SequenceWeights(NamedTuple):
    """Per-sequence (B,) quantities of one `dfpo_loss` call, detached: what `dfpo_diagnostics` reads."""

    carries: Tensor  # bool: rows with loss (valid tokens, a non-zero loss weight) off the clip bounds (Eq. 47)
    effective: Tensor  # s_bar times the loss weight: the coefficient GSPO's gradient carries
    members: Tensor  # bool: the rows the transform's constraint ranges over
    advantages: Tensor  # A_i
    lengths: Tensor  # valid tokens per row
    s_til: Tensor  # the transformed weights (GSPO's `effective` for "none")
    groups: Groups


@dataclass
class DFPOOutput(ObjectiveOutput):
    """`dfpo_loss`'s output: the loss and clip indicators, plus its sequence weights for `dfpo_diagnostics`."""

    weights: SequenceWeights | None = None


def dfpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    groups: Groups,
    *,
    transform: str,
    epsilon_low: float,
    epsilon_high: float,
    orth_floor: float = 1e-6,
    orthogonal_over: str = "all",
    importance_weights: Tensor | None = None,
) -> DFPOOutput:
    """DFPO on GSPO (App. B, Eq. 44-55; phi-form of App. C/K; the module docstring, docs/dfpo.md); `DFPOConfig`
    checks the settings once. Advantages constant along T; ``importance_weights``: TRL's per-token
    loss weights, applied here: the transform acts on ``s_bar_i w_i``, so the cancellation includes them (under
    ``"none"``: per token, as TRL). Returns per_token_loss (B, 1) = ``-A_i s_til_i`` in value ((B, T) for ``"none"``
    with (B, T) weights), TRL's (B, 1) clip indicators, and `weights` for `dfpo_diagnostics`.
    """
    check_token_inputs(per_token_logps, old_per_token_logps, mask, advantages)
    groups = groups.covering(mask.shape[0])
    adv = advantages if advantages.dim() == 1 else advantages[:, 0]  # (B,); TRL expands (B,) to (B, T) this way
    if advantages.dim() == 2 and not torch.equal(advantages, adv.unsqueeze(1).expand_as(advantages)):
        raise ValueError(
            "dfpo_loss is sequence-level: (B, T) advantages must be constant along T "
            "(got token-varying advantages); pass (B,) advantages"
        )

    dtype = compute_dtype(per_token_logps, old_per_token_logps)
    mask_f = mask.to(dtype)  # (B, T)
    adv = adv.detach().to(dtype)  # (B,)
    log_ratio = per_token_logps.to(dtype) - old_per_token_logps.detach().to(dtype)  # (B, T)
    log_s = log_importance_weights(log_ratio, mask_f, "sequence").squeeze(-1)  # (B,) Eq. 44, in log space
    s = torch.exp(log_s).detach()  # (B,)
    lower, upper = 1.0 - epsilon_low, 1.0 + epsilon_high
    # Eq. 47: A >= 0 takes min(s, c), which is the bound only above it; A < 0 takes max(s, c),
    # the bound only below it. Clipped sequences sit on a constant and get no gradient.
    clipped_high = (adv >= 0) & (s > upper)  # (B,)
    clipped_low = (adv < 0) & (s < lower)  # (B,)
    clipped = clipped_high | clipped_low  # (B,)
    s_bar = torch.where(clipped_high, upper, torch.where(clipped_low, lower, s))  # (B,) Eq. 47, values only
    # exp(log s - sg(log s)): value exactly 1, gradient d log s for unclipped sequences, 0 for clipped ones.
    log_factor = torch.where(clipped, torch.zeros_like(log_s), log_s - log_s.detach())  # (B,)
    lengths = mask_f.sum(-1)  # (B,)
    # One loss weight per sequence: a (B, 1) weight as it is; (B, T) weights (``token_*`` IS modes, the entropy mask)
    # weigh sequence i, under any loss_type, by their mean over its valid tokens (0 for a row without any)
    weights = checked_token_weights(importance_weights, mask.shape, dtype)  # (B, T), (B, 1) or None
    if weights is None:
        is_weight = torch.ones_like(lengths)  # (B,)
    else:
        is_weight = weights.squeeze(1) if weights.shape[1] == 1 else masked_mean(weights, mask_f, dim=-1)  # (B,)
    effective = s_bar * is_weight  # (B,)
    present = (lengths > 0) & (is_weight > 0)  # (B,)
    members = present & ~clipped if orthogonal_over == "unclipped" else present  # (B,)

    if transform == "none":
        s_til = effective  # (B,)
    else:  # clipped members under "unclipped" keep GSPO's constant value, rows without loss get 0
        transformed = group_transform(effective, adv, groups, transform, orth_floor=orth_floor, members=members)
        s_til = torch.where(members, transformed, torch.where(present, effective, 0.0))  # (B,)
    coefficient = s_bar if transform == "none" else s_til  # (B,) "none": TRL's GSPO, IS weights per token below
    per_token_loss = (-adv * coefficient * torch.exp(log_factor)).unsqueeze(-1)  # (B, 1) -A sg(s_til/s_bar) s_bar
    if transform == "none" and weights is not None:  # TRL: the loss times the IS weights, (B, 1) or (B, T)
        per_token_loss = per_token_loss * weights
    # TRL's (B, 1) indicators: the clipped rows, high ones only where A > 0
    metrics = clip_indicators(clipped_low.unsqueeze(-1), (clipped_high & (adv > 0)).unsqueeze(-1))
    seq = SequenceWeights(present & ~clipped, effective, members, adv, lengths, s_til.detach(), groups)
    return DFPOOutput(per_token_loss, metrics, seq)
