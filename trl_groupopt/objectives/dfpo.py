"""DFPO: in-group re-weighting of GSPO's sequence weights that restores token-gradient cancellation.

Paper: Ding et al., arXiv:2604.13088 (App. B-D, K; equation numbers are the paper's). The derivation, the reading of
each equation and every deviation from the paper are in ``docs/dfpo.md``. In short, per sequence ``i`` of a group::

    s_i     = exp( (1/|y_i|) sum_t log r_it )                      (44)  GSPO ratio, with gradient
    s_bar_i = min(s_i, clip(s_i)) if A_i >= 0 else max(...)        (46)-(47)  sign-aware post-clip
    e_i     = s_bar_i * w_i                                        w_i: the trainer's loss weight (1: none)
    s_til   = T(sg(e), A) over the members M of each group         (50) min_replace, (52)-(55) orth_proj, (51) QP
    loss_i  = -A_i * sg(s_til_i / s_bar_i) * s_bar_i               phi-form, App. C/K

so sequence ``i`` gets the gradient ``-A_i s_til_i grad log s_i`` when unclipped and none when clipped, and every
transform but ``"none"`` makes ``sum_{i in M} A_i s_til_i = 0``: the gradient of a token shared by the whole group
cancels, under a loss_type that weighs every token alike (``"dapo"``, the default; not ``"grpo"``). ``M`` is the whole
group (``orthogonal_over="all"``, the paper's constraint) or its members that carry gradient (``"unclipped"``), which
keeps the cancellation exact under clipping. ``"none"`` is TRL's GSPO, loss and gradient. GRPO-fix (App. H) is in
`grpo_fix.py`, the logged diagnostics (Eq. 23, 87, the cancellation residual) in `dfpo_diagnostics.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .common import (
    Groups,
    ObjectiveOutput,
    as_groups,
    check_choice,
    check_positive,
    check_token_inputs,
    compute_dtype,
    log_importance_weights,
    masked_mean,
    named,
    names_of,
)

__all__ = [
    "ORTHOGONAL_OVER",
    "TRANSFORMS",
    "DFPOOutput",
    "SequenceWeights",
    "dfpo_loss",
    "group_transform",
    "validate_dfpo",
]

#: The in-group transforms of the post-clip weights (the one list of names; the trainer imports it).
TRANSFORMS: tuple[str, ...] = ("none", "min_replace", "orth_proj", "orth_proj_qp")
#: Which members of a group the orthogonality constraint ranges over (see `dfpo_loss`).
ORTHOGONAL_OVER: tuple[str, ...] = ("all", "unclipped")
#: The transforms that can enforce ``sum_i A_i s_til_i = 0`` over an arbitrary subset of a group.
_SUBSET_TRANSFORMS: tuple[str, ...] = ("orth_proj", "orth_proj_qp")


def validate_dfpo(
    *,
    transform: str,
    epsilon_low: float,
    epsilon_high: float,
    orth_floor: float,
    orthogonal_over: str,
    names: Mapping[str, str] | None = None,
) -> None:
    """Raise, naming the fix, unless `dfpo_loss` can take these settings (`DFPOConfig` runs it once; `names`: see
    `common.named`). ``orthogonal_over="unclipped"`` needs a transform that makes ``sum_i A_i s_til_i = 0`` over any
    subset of a group (the projections): ``min_replace`` gives ``min_j s_j * sum_{i in M} A_i``, which a clipped
    member makes non-zero; ``"none"`` has no constraint to restrict."""
    transform_name, over_name = names_of(names, "transform", "orthogonal_over")
    check_choice(transform_name, transform, TRANSFORMS)
    check_positive(**named(names, epsilon_low=epsilon_low, epsilon_high=epsilon_high, orth_floor=orth_floor),
                   finite=True)  # fmt: skip
    check_choice(over_name, orthogonal_over, ORTHOGONAL_OVER)
    if orthogonal_over == "unclipped" and transform not in _SUBSET_TRANSFORMS:
        raise ValueError(
            f"{over_name}='unclipped' needs a transform that enforces sum_i A_i s_til_i = 0 over the unclipped "
            f"members of a group ({', '.join(_SUBSET_TRANSFORMS)}), not {transform_name}={transform!r} (min_replace "
            "only cancels when the advantages of those members sum to zero; 'none' has no constraint). Use "
            f"{transform_name}='orth_proj' or 'orth_proj_qp', or {over_name}='all'."
        )


def both_signs(adv: Tensor, groups: Groups) -> Tensor:
    """(B,) bool: the element's group holds a positive and a negative advantage."""
    has_pos = groups.reduce((adv > 0).to(adv.dtype), "amax") > 0  # (K,)
    has_neg = groups.reduce((adv < 0).to(adv.dtype), "amax") > 0  # (K,)
    return groups.broadcast(has_pos & has_neg)


# --------------------------------------------------------------------------------------------
# group transforms
# --------------------------------------------------------------------------------------------


def _orth_proj(s_bar: Tensor, adv: Tensor, groups: Groups, floor: float) -> Tensor:
    """Truncate-and-rebalance (Eq. 52-55, beta with the corrected sign) and the floor guard, see docs/dfpo.md."""
    zero = torch.zeros_like(s_bar)
    inf = torch.full_like(s_bar, float("inf"))
    tiny = torch.finfo(s_bar.dtype).tiny

    s_plus = s_bar.clamp_min(floor)  # (B,) Eq. 52
    is_pos, is_neg = adv > 0, adv < 0  # (B,) P and N
    has_pos = groups.rows(is_pos.to(s_bar.dtype), "sum") > 0  # (B,) group has a member in P
    has_neg = groups.rows(is_neg.to(s_bar.dtype), "sum") > 0  # (B,)
    mass_pos = groups.rows(torch.where(is_pos, adv * s_plus, zero), "sum")  # (B,) sum_P A s+
    mass_neg = groups.rows(torch.where(is_neg, -adv * s_plus, zero), "sum")  # (B,) sum_N -A s+
    delta = mass_pos - mass_neg  # (B,) Eq. 53

    # Eq. 55 (beta's sign corrected). delta > 0 implies mass_pos > 0, delta < 0 mass_neg > 0;
    # the clamps only keep the unused branch finite.
    alpha = mass_neg / mass_pos.clamp_min(tiny)  # (B,) in [0, 1) where delta > 0
    beta = mass_pos / mass_neg.clamp_min(tiny)  # (B,) in [0, 1) where delta < 0
    one = torch.ones_like(s_bar)
    scale_pos = torch.where(delta > 0, alpha, one)  # (B,) Eq. 54
    scale_neg = torch.where(delta < 0, beta, one)  # (B,)

    # Floor guard (mixed-sign groups only): if the shrunk side would dip below the floor, shrink it
    # only until its smallest member reaches the floor and scale the other side up to rebalance.
    min_pos = groups.rows(torch.where(is_pos, s_plus, inf), "amin")  # (B,) inf if P empty
    min_neg = groups.rows(torch.where(is_neg, s_plus, inf), "amin")  # (B,)
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
    max_size = groups.max_size
    dtype, device = s_bar.dtype, s_bar.device
    inf = float("inf")
    tiny = torch.finfo(dtype).tiny

    dense_adv = groups.dense(adv)  # (K, G) padding: A = 0
    dense_s = groups.dense(s_bar)  # (K, G)
    active = dense_adv != 0  # (K, G) padding and A = 0 have no breakpoint
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

    zero = torch.zeros_like(as_sorted)
    # Piece j = (b_(j-1), b_(j)): active are N members left of it (idx < j) and P members right of
    # it (idx >= j), where g(lam) = c0_j - lam c1_j.
    c0 = prefix(torch.where(is_neg, as_sorted, zero)) + suffix(torch.where(is_pos, as_sorted, zero))  # (K, G + 1)
    c1 = prefix(torch.where(is_neg, aa_sorted, zero)) + suffix(torch.where(is_pos, aa_sorted, zero))  # (K, G + 1)

    valid = torch.arange(max_size, device=device) < num_breaks.unsqueeze(1)  # (K, G)
    finite_breaks = torch.where(valid, breaks, torch.zeros_like(breaks))  # (K, G)
    g_at_break = c0[:, :-1] - finite_breaks * c1[:, :-1]  # (K, G) g(b_k), from piece k
    crossed = (g_at_break <= 0) & valid  # (K, G)
    first = crossed.to(torch.int64).argmax(1)  # (K,) first index where g <= 0 (argmax: first max)
    piece = torch.where(crossed.any(1), first, num_breaks)  # (K,) root lies on this piece

    c0_p = c0.gather(1, piece.unsqueeze(1)).squeeze(1)  # (K,)
    c1_p = c1.gather(1, piece.unsqueeze(1)).squeeze(1)  # (K,)
    last = max(max_size - 1, 0)
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
    groups: Groups | Tensor,
    method: str,
    *,
    orth_floor: float = 1e-6,
    members: Tensor | None = None,
) -> Tensor:
    """In-group transform of the post-clip sequence weights (Eq. 50, 51, 52-55), detached.

    ``s_bar`` (B,) >= 0 and ``advantages`` (B,); ``groups`` as in `dfpo_loss`; ``method`` one of ``TRANSFORMS``;
    ``orth_floor`` Eq. 52's floor (``"orth_proj"``); ``members`` optional (B,) bool, the members the transform ranges
    over (the others are returned unchanged and enter neither a group's minimum nor its constraint). Returns (B,)
    ``s_til`` in float32 (half / bf16 inputs) or the input's float dtype. For every method but ``"none"``, a group
    whose advantages do not take both signs gets ``s_til = 0`` on its members with ``A != 0``: no ``v >= 0`` but
    that satisfies ``A^T v = 0`` (for ``min_replace`` a deviation, docs/dfpo.md); with TRL's centred advantages such
    a group has equal rewards, and its advantages are rounding noise.
    """
    if s_bar.dim() != 1 or advantages.shape != s_bar.shape:
        raise ValueError(f"s_bar and advantages must be (B,), got {tuple(s_bar.shape)}, {tuple(advantages.shape)}")
    groups = as_groups(groups, s_bar.shape[0])
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


def _sequence_advantages(advantages: Tensor, batch: int, length: int) -> Tensor:
    """(B,) sequence advantages from (B,), (B, 1) or a (B, T) tensor constant along T."""
    if advantages.dim() == 1 and advantages.shape[0] == batch:
        return advantages
    if advantages.dim() == 2 and advantages.shape[0] == batch and advantages.shape[1] in (1, length):
        # A sequence-level objective needs one advantage per sequence: take column 0, but only
        # after checking the row is constant (TRL expands (B,) to (B, T) this way).
        first = advantages[:, :1]  # (B, 1)
        if not torch.equal(advantages, first.expand_as(advantages)):
            raise ValueError(
                "dfpo_loss is sequence-level: (B, T) advantages must be constant along T "
                "(got token-varying advantages); pass (B,) advantages"
            )
        return first.squeeze(1)
    raise ValueError(
        f"advantages must be ({batch},) or ({batch}, {length}) constant along T, got shape {tuple(advantages.shape)}"
    )


def _sequence_is_weights(weights: Tensor | None, mask: Tensor) -> Tensor:
    """(B,) one loss weight per sequence, detached; ones without weights. (B, T) weights (``token_*`` IS modes, the
    entropy mask) times a (B, 1) loss weigh sequence ``i``, under any ``loss_type``, by their mean over its valid
    tokens (0 for a row without any)."""
    batch, length = mask.shape
    if weights is None:
        return torch.ones(batch, dtype=mask.dtype, device=mask.device)
    weights = weights.detach().to(mask.dtype)
    if weights.dim() == 2 and weights.shape[0] == batch and weights.shape[1] == 1:
        return weights.squeeze(1)
    if weights.shape == (batch, length):
        return masked_mean(weights, mask, dim=-1)
    raise ValueError(f"importance_weights must be ({batch}, 1) or ({batch}, {length}), got {tuple(weights.shape)}")


class SequenceWeights(NamedTuple):
    """Per-sequence (B,) quantities of one `dfpo_loss` call, detached but for `log_factor`: what the diagnostics read."""

    s: Tensor  # GSPO ratio
    bounds: tuple[float, float]  # (1 - eps_low, 1 + eps_high)
    s_bar: Tensor  # Eq. 47 post-clip values
    clipped: Tensor  # bool: on a clip bound, no gradient
    log_factor: Tensor  # value 0; gradient d log s where unclipped, 0 where clipped
    effective: Tensor  # s_bar times the loss weight: the coefficient GSPO's gradient carries
    present: Tensor  # bool: rows that can carry loss at all
    members: Tensor  # bool: the rows the transform's constraint ranges over
    advantages: Tensor  # A_i
    lengths: Tensor  # valid tokens per row
    s_til: Tensor | None = None  # the transformed weights (GSPO's `effective` for "none")
    groups: Groups | None = None


@dataclass
class DFPOOutput(ObjectiveOutput):
    """`dfpo_loss`'s output: the loss and clip indicators, plus its sequence weights for `dfpo_diagnostics`."""

    weights: SequenceWeights | None = None


def dfpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    groups: Groups | Tensor,
    *,
    transform: str,
    epsilon_low: float,
    epsilon_high: float,
    orth_floor: float = 1e-6,
    orthogonal_over: str = "all",
    importance_weights: Tensor | None = None,
) -> DFPOOutput:
    """DFPO on GSPO (App. B, Eq. 44-55; phi-form of App. C/K): the module docstring and docs/dfpo.md. The settings
    are not re-checked per call: `validate_dfpo` states their rules (`DFPOConfig` runs it once).

    Args:
        per_token_logps, old_per_token_logps, mask: (B, T) current and behaviour log-probs (the latter constant), and
            the completion mask.
        advantages: (B,) sequence advantages, or (B, T) / (B, 1) constant along T.
        groups: the trainer's `Groups.contiguous(B, num_generations)` (reads nothing from the device), or (B,)
            integer group ids in any order (`Groups.from_ids`).
        transform, epsilon_low, epsilon_high, orth_floor: ``TRANSFORMS``; GSPO's clip range
            ``[1 - eps_low, 1 + eps_high]``; Eq. 52's floor (``"orth_proj"``).
        orthogonal_over: ``"all"`` (the paper): the transform ranges over every member with a valid token and a
            non-zero loss weight, a clipped one counted at its bound although it carries no gradient; ``"unclipped"``
            (projections only): over the members that carry gradient, so the shared-token gradient cancels under
            clipping too; clipped members keep GSPO's constant value.
        importance_weights: TRL's per-token loss weights (vLLM IS weights times the off-policy and entropy masks),
            (B, 1) or (B, T), or None; applied here, not by the caller. The transform acts on ``s_bar_i w_i``
            (`_sequence_is_weights`), so the cancellation includes them and a member with ``w_i = 0`` leaves its
            group; under ``"none"`` they multiply GSPO's loss token by token, as TRL does.

    Returns:
        `DFPOOutput`: per_token_loss (B, 1) = ``-A_i s_til_i`` in value ((B, T) for ``"none"`` with (B, T) weights;
        float32 for half / bf16 inputs); ``clip_ratio/low|high|region`` (B, 1) indicators with TRL's semantics; and
        `weights`, from which `dfpo_diagnostics` computes the logged diagnostics.
    """
    check_token_inputs(per_token_logps, old_per_token_logps, mask)
    batch, length = per_token_logps.shape
    groups = as_groups(groups, batch)

    dtype = compute_dtype(per_token_logps, old_per_token_logps)
    logp = per_token_logps.to(dtype)  # (B, T)
    mask_f = mask.to(dtype)  # (B, T)
    adv = _sequence_advantages(advantages, batch, length).detach().to(dtype)  # (B,)
    log_ratio = logp - old_per_token_logps.detach().to(dtype)  # (B, T)
    log_s = log_importance_weights(log_ratio, mask_f, "sequence").squeeze(-1)  # (B,) Eq. 44, in log space
    is_weight = _sequence_is_weights(importance_weights, mask_f)  # (B,)
    seq = _post_clip(log_s, adv, is_weight, mask_f, (1.0 - epsilon_low, 1.0 + epsilon_high), orthogonal_over)

    if transform == "none":
        s_til = seq.effective  # (B,)
    else:  # clipped members under "unclipped" keep GSPO's constant value, rows without loss get 0
        transformed = group_transform(seq.effective, adv, groups, transform, orth_floor=orth_floor,
                                      members=seq.members)  # fmt: skip
        s_til = torch.where(seq.members, transformed, torch.where(seq.present, seq.effective, 0.0))  # (B,)
    coefficient = seq.s_bar if transform == "none" else s_til  # (B,) "none": TRL's GSPO, IS weights per token below
    per_token_loss = (-adv * coefficient * torch.exp(seq.log_factor)).unsqueeze(-1)  # (B, 1) -A sg(s_til/s_bar) s_bar
    if transform == "none" and importance_weights is not None:  # TRL: the loss times the IS weights, (B, 1) or (B, T)
        per_token_loss = per_token_loss * importance_weights.detach().to(dtype)
    with torch.no_grad():
        lower, upper = seq.bounds
        is_low = ((seq.s < lower) & (adv < 0)).float().unsqueeze(-1)  # (B, 1) TRL's indicators
        is_high = ((seq.s > upper) & (adv > 0)).float().unsqueeze(-1)  # (B, 1)
    metrics = {
        "clip_ratio/low": is_low,
        "clip_ratio/high": is_high,
        "clip_ratio/region": torch.maximum(is_low, is_high),
    }
    return DFPOOutput(per_token_loss, metrics, seq._replace(s_til=s_til.detach(), groups=groups))


def _post_clip(
    log_s: Tensor, adv: Tensor, is_weight: Tensor, mask_f: Tensor, bounds: tuple[float, float], orthogonal_over: str
) -> SequenceWeights:
    """Eq. 47's sign-aware post-clip of the GSPO ratios, and the members the transform ranges over."""
    lower, upper = bounds
    s_det = torch.exp(log_s).detach()  # (B,)
    # Eq. 47: A >= 0 takes min(s, c), which is the bound only above it; A < 0 takes max(s, c),
    # the bound only below it. Clipped sequences sit on a constant and get no gradient.
    clipped_high = (adv >= 0) & (s_det > upper)  # (B,)
    clipped_low = (adv < 0) & (s_det < lower)  # (B,)
    clipped = clipped_high | clipped_low  # (B,)
    s_bar = torch.where(clipped_high, upper, torch.where(clipped_low, lower, s_det))  # (B,) Eq. 47, values only
    # exp(log s - sg(log s)): value exactly 1, gradient d log s for unclipped sequences, 0 for clipped ones.
    log_factor = torch.where(clipped, torch.zeros_like(log_s), log_s - log_s.detach())  # (B,)
    present = (mask_f.sum(-1) > 0) & (is_weight > 0)  # (B,)
    members = present & ~clipped if orthogonal_over == "unclipped" else present  # (B,)
    return SequenceWeights(
        s_det, bounds, s_bar, clipped, log_factor, s_bar * is_weight, present, members, adv, mask_f.sum(-1)
    )
