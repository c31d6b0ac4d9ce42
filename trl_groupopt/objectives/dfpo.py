"""DFPO: in-group re-weighting of GSPO's sequence weights, and GRPO-fix (symmetric clipping).

Paper: "DFPO" (paper 001 in /work/shared/papers; Sec. 3-4, App. A-D, H, K). Equation numbers
below are the paper's.

DFPO on GSPO (App. B), per sequence ``i`` of a group of size ``G``::

    s_i     = exp( (1/|y_i|) sum_t log r_it )                          (44)  GSPO ratio, with grad
    c_i     = clip(s_i, 1 - eps_low, 1 + eps_high)                     (46)
    s_bar_i = min(s_i, c_i) if A_i >= 0 else max(s_i, c_i)             (47)  sign-aware post-clip
    J_GSPO  = 1/G sum_i A_i s_bar_i                                    (49)  == GSPO's (48) exactly
    s_til   = T(sg(s_bar), A) within each group                        (50) / (51)-(55)
    loss_i  = -A_i * sg(s_til_i / s_bar_i) * s_bar_i                   (App. C/K phi-form, (59)-(62))

So the gradient of sequence ``i`` is ``-A_i s_til_i (1/|y_i|) sum_t grad log p_it`` when unclipped
and 0 when clipped (GSPO's trust region is kept), and ``s_til`` never receives gradient (App. D,
"stop-gradient"; the paper's "no stop-grad" ablation is worse, App. K.6). The value of ``loss_i``
is ``-A_i s_til_i``. It is evaluated in log space as
``-A_i * s_til_i * exp(log s_bar_i - sg(log s_bar_i))`` (the last factor is exactly 1 in value and
carries ``d log s_bar_i``), which equals the SPEC form in value and gradient and never divides by
an underflowed ``s_bar``. For ``transform="none"`` this is GSPO as TRL computes it
(``importance_sampling_level="sequence"``, ``-min(coef_1 A, coef_2 A)``), loss and gradient.

Transforms ``T`` (``group_transform``), all on the detached post-clip weights ``s_bar``:

* ``"none"``: identity (plain GSPO).
* ``"min_replace"``: ``s_til_i = min_j s_bar_j`` over the group (50).
* ``"orth_proj"``: truncate-and-rebalance closed form (52)-(55)::

      s+    = max(s_bar, floor)                                         (52)
      delta = sum_i A_i s+_i                                            (53)
      delta > 0: s_til_P = alpha s+_P,  alpha = sum_N (-A_i) s+_i / sum_P A_i s+_i   (54), (55)
      delta < 0: s_til_N = beta  s+_N,  beta  = sum_P A_i s+_i / sum_N (-A_i) s+_i
      delta = 0: s_til = s+

  with ``P = {A_i > 0}``, ``N = {A_i < 0}``. Eq. (55) as printed has ``beta = -sum_P A_i s+_i /
  sum_N (-A_i) s+_i``, which is negative; the value that restores ``sum_i A_i s_til_i = 0`` (and
  lies in (0, 1] as the paper states) is the one above, and that is what is implemented (SPEC
  section 3). ``alpha`` is as printed. Members with ``A_i = 0`` keep ``s+_i``; a group whose
  advantages are all zero is left at ``s+`` (the ``delta = 0`` case of (54)), i.e. unchanged
  wherever ``s_bar >= floor``.

  Two cases the paper's claim "s_til >= eps 1 and A^T s_til = 0 by construction" does not cover,
  resolved here so that both properties hold whenever they can:

  - *Floor guard (mixed-sign groups).* ``alpha s+_i`` can fall below the floor when the other
    side's mass is tiny (e.g. ``A = (10, -1)``, ``s+ = (1, 1e-6)`` gives ``alpha = 1e-7``). In such
    a group the shrunk side is scaled by ``floor / min_side s+`` instead (its smallest member lands
    on the floor) and the other side is scaled *up* by the factor that restores orthogonality.
    Both sides stay proportional to ``s+`` and ``>= floor``. Groups where (54)-(55) already respect
    the floor (every realistic group) get exactly (54)-(55).
  - *Single-sign groups* (only positive, or only negative, non-zero advantages; impossible with
    TRL's group-centred advantages). No ``v >= floor > 0`` satisfies ``A^T v = 0``. Eq. (54)-(55)
    give ``alpha = 0`` (resp. ``beta = 0``): the non-zero-advantage members get ``s_til = 0`` (zero
    gradient), which is also the exact projection (51). Members with ``A_i = 0`` keep ``s+``. So
    here orthogonality holds and the floor does not.

  Afterwards ``sum_i A_i s_til_i = 0`` up to rounding in every group, and ``s_til >= floor`` in
  every group that has both signs or only zeros.
* ``"orth_proj_qp"``: the exact non-negative projection (51),
  ``argmin_v 1/2 ||v - s_bar||^2  s.t.  A^T v = 0, v >= 0``. KKT: ``v_i = max(s_bar_i - lam A_i, 0)``
  with ``g(lam) = sum_i A_i v_i`` continuous, piecewise linear and non-increasing, with breakpoints
  ``b_i = s_bar_i / A_i``. The root is found exactly: sort the breakpoints per group, evaluate
  ``g`` at each from cumulative sums, take the first breakpoint with ``g <= 0`` and solve the
  linear piece to its left. Vectorised over groups (a padded (K, G_max) view), no solver.

GRPO-fix (App. H): token-level symmetric clipping, the same clip for both advantage signs::

    phi(r) = clip(r, 0, 1 + eps_high)                                  (79)
    J      = 1/G sum_i sum_t phi(r_it) A_i                             (80)

Eq. (80) is the clip alone, not PPO's ``min(rA, clip(r) A)`` (App. H.3: "replace the per-token
effective weight min(r A, clip(r) A) with A clip(r, 0, 1 + eps)"); so a token with ``r > 1 + eps``
gets no gradient whatever the sign of ``A``, and one with ``r <= 1 + eps`` gets ``-A r grad log p``.
``symmetric_clip_loss`` returns the (B, T) ``-A phi(r)``; the ``1/G sum_t`` normalisation is the
trainer's ``loss_type``.

Metrics. ``dfpo/asym_before`` / ``dfpo/asym_after``: Eq. (23) ``Asym = Var_i(w_i A_i)`` with
``w = s_bar`` / ``w = s_til``, averaged over the groups of the micro-batch. The paper writes
``Var_{i in {1..G}}`` over the finite set of the group's members without a correction, so the
*population* variance (divide by ``G``) is used; a single-member group has ``Asym = 0``.
``dfpo/shrink``: mean over sequences of ``s_til / s_bar`` (App. K's ``phi_i``, (87)). Clip fractions
follow TRL's sequence-level semantics (fractions of all B sequences, as TRL's
``global_masked_mean`` does for (B, 1) tensors): ``clip_ratio/low`` = ``s < 1 - eps_low`` with
``A < 0``, ``clip_ratio/high`` = ``s > 1 + eps_high`` with ``A > 0``, ``clip_ratio/region`` = either.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .common import (
    ObjectiveOutput,
    as_token_advantages,
    check_token_shapes,
    compute_dtype,
    group_index,
    group_mean,
    group_min,
    group_sum,
    log_importance_weights,
    masked_sum,
    nan_if_empty,
)

__all__ = ["TRANSFORMS", "dfpo_loss", "group_dense_view", "group_transform", "symmetric_clip_loss"]

TRANSFORMS: tuple[str, ...] = ("none", "min_replace", "orth_proj", "orth_proj_qp")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------




def _check_epsilon(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_group_ids(group_ids: Tensor, batch: int) -> None:
    if group_ids.dim() != 1 or group_ids.shape[0] != batch:
        raise ValueError(f"group_ids must be ({batch},), got shape {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")




def group_dense_view(group_ids: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """Padded (K, G_max) view of arbitrary, possibly unequal groups.

    Returns ``(index, slot, K, G_max)``: element ``b`` of a (B,) tensor sits at
    ``dense[index[b], slot[b]]`` of a (K, G_max) tensor (groups in order of their sorted ids,
    members in batch order). Used by ``orth_proj_qp`` to sort within groups without a loop.
    """
    index, num_groups = group_index(group_ids)  # (B,), K
    batch = index.shape[0]
    counts = torch.bincount(index, minlength=num_groups)  # (K,)
    starts = torch.cumsum(counts, 0) - counts  # (K,) first sorted position of each group
    order = torch.argsort(index, stable=True)  # (B,) batch positions grouped by group
    slot = torch.empty_like(index)  # (B,)
    slot[order] = torch.arange(batch, device=index.device) - starts[index[order]]
    max_size = int(counts.max().item()) if batch else 0
    return index, slot, num_groups, max_size


def _mean_group_variance(values: Tensor, group_ids: Tensor) -> Tensor:
    """Mean over groups of the population variance of ``values`` within each group (Eq. 23).

    In float64, saturated at float32's largest value: an unclipped ratio of e^50 (A < 0 keeps large ratios, Eq. 47)
    squares to ~1e43, which would make the float32 metric inf and poison the logged mean.
    """
    _, num_groups = group_index(group_ids)
    if num_groups == 0:
        return torch.tensor(float("nan"))
    values = values.double()
    centred = values - group_mean(values, group_ids)  # (B,)
    variance = group_mean(centred * centred, group_ids)  # (B,) broadcast per group
    size = group_sum(torch.ones_like(values), group_ids)  # (B,)
    # each group's variance appears `size` times: weight 1/size to count each group once
    return ((variance / size).sum() / num_groups).clamp(max=torch.finfo(torch.float32).max)


# --------------------------------------------------------------------------------------------
# group transforms
# --------------------------------------------------------------------------------------------


def _orth_proj(s_bar: Tensor, adv: Tensor, group_ids: Tensor, floor: float) -> Tensor:
    """Truncate-and-rebalance (Eq. 52-55, beta with the corrected sign), see module docstring."""
    zero = torch.zeros_like(s_bar)
    inf = torch.full_like(s_bar, float("inf"))
    tiny = torch.finfo(s_bar.dtype).tiny

    s_plus = s_bar.clamp_min(floor)  # (B,) Eq. 52
    is_pos, is_neg = adv > 0, adv < 0  # (B,) P and N
    has_pos = group_sum(is_pos.to(s_bar.dtype), group_ids) > 0  # (B,) group has a member in P
    has_neg = group_sum(is_neg.to(s_bar.dtype), group_ids) > 0  # (B,)
    mass_pos = group_sum(torch.where(is_pos, adv * s_plus, zero), group_ids)  # (B,) sum_P A s+
    mass_neg = group_sum(torch.where(is_neg, -adv * s_plus, zero), group_ids)  # (B,) sum_N -A s+
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
    min_pos = group_min(torch.where(is_pos, s_plus, inf), group_ids)  # (B,) inf if P empty
    min_neg = group_min(torch.where(is_neg, s_plus, inf), group_ids)  # (B,)
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


def _orth_proj_qp(s_bar: Tensor, adv: Tensor, group_ids: Tensor) -> Tensor:
    """Exact solution of Eq. 51 per group via the sorted KKT breakpoints (module docstring)."""
    index, slot, num_groups, max_size = group_dense_view(group_ids)
    dtype, device = s_bar.dtype, s_bar.device
    inf = float("inf")
    tiny = torch.finfo(dtype).tiny

    dense_adv = torch.zeros(num_groups, max_size, dtype=dtype, device=device)  # (K, G)
    dense_s = torch.zeros(num_groups, max_size, dtype=dtype, device=device)  # (K, G)
    dense_adv[index, slot] = adv
    dense_s[index, slot] = s_bar
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

    return (s_bar - lam[index] * adv).clamp_min(0.0)  # (B,) KKT: v = max(s_bar - lam A, 0)


def group_transform(
    s_bar: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    method: str,
    *,
    orth_floor: float = 1e-6,
) -> Tensor:
    """In-group transform of the post-clip sequence weights (Eq. 50, 51, 52-55). Detached.

    Args:
        s_bar: (B,) post-clip weights ``s_bar`` (Eq. 47), positive. Gradient is never taken.
        advantages: (B,) sequence advantages.
        group_ids: (B,) integer tensor; equal values mark one group (any sizes >= 1, any order).
        method: one of ``TRANSFORMS`` (see the module docstring).
        orth_floor: the floor ``eps`` of Eq. 52 for ``"orth_proj"`` (>= 0).

    Returns:
        (B,) ``s_til``, detached, in float32 (half / bf16 inputs) or the input's float dtype.
    """
    if method not in TRANSFORMS:
        raise ValueError(f"unknown DFPO transform {method!r}; valid: {', '.join(TRANSFORMS)}")
    if s_bar.dim() != 1:
        raise ValueError(f"s_bar must be (B,), got shape {tuple(s_bar.shape)}")
    if advantages.shape != s_bar.shape:
        raise ValueError(f"advantages must match s_bar {tuple(s_bar.shape)}, got {tuple(advantages.shape)}")
    _check_group_ids(group_ids, s_bar.shape[0])
    if not (math.isfinite(orth_floor) and orth_floor >= 0):
        raise ValueError(f"orth_floor must be a finite number >= 0, got {orth_floor!r}")

    dtype = compute_dtype(s_bar, advantages)
    s = s_bar.detach().to(dtype)  # (B,)
    adv = advantages.detach().to(dtype)  # (B,)
    group_ids = group_ids.to(s.device)
    if s.numel() == 0 or method == "none":
        return s.clone()
    if method == "min_replace":
        return group_min(s, group_ids)  # (B,) Eq. 50
    if method == "orth_proj":
        return _orth_proj(s, adv, group_ids, float(orth_floor))  # (B,) Eq. 52-55
    return _orth_proj_qp(s, adv, group_ids)  # (B,) Eq. 51


# --------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------




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


def dfpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    transform: str,
    epsilon_low: float,
    epsilon_high: float,
    orth_floor: float = 1e-6,
) -> ObjectiveOutput:
    """DFPO on GSPO (App. B, Eq. 44-55; phi-form of App. C/K). See the module docstring.

    Args:
        per_token_logps: (B, T) log-probs of the sampled tokens under the current policy.
        old_per_token_logps: (B, T) the same under the behaviour policy (treated as constant).
        advantages: (B,) sequence advantages, or (B, T) / (B, 1) constant along T.
        mask: (B, T) completion mask (bool / int / float).
        group_ids: (B,) integer group ids (never inferred from position).
        transform: one of ``TRANSFORMS``.
        epsilon_low, epsilon_high: GSPO's clip range ``[1 - eps_low, 1 + eps_high]`` (> 0).
        orth_floor: the floor of Eq. 52 (``transform="orth_proj"``).

    Returns:
        ObjectiveOutput with per_token_loss (B, 1) = ``-A_i s_til_i`` in value (gradient as the
        module docstring), float32 for half / bf16 inputs; metrics ``dfpo/asym_before``,
        ``dfpo/asym_after``, ``dfpo/shrink``, ``clip_ratio/low|high|region``.
    """
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown DFPO transform {transform!r}; valid: {', '.join(TRANSFORMS)}")
    _check_epsilon("epsilon_low", epsilon_low)
    _check_epsilon("epsilon_high", epsilon_high)
    check_token_shapes(per_token_logps, old_per_token_logps, mask)
    batch, length = per_token_logps.shape
    _check_group_ids(group_ids, batch)

    dtype = compute_dtype(per_token_logps, old_per_token_logps)
    logp = per_token_logps.to(dtype)  # (B, T)
    old_logp = old_per_token_logps.detach().to(dtype)  # (B, T)
    mask_f = mask.to(dtype)  # (B, T)
    adv = _sequence_advantages(advantages, batch, length).detach().to(dtype)  # (B,)
    group_ids = group_ids.to(logp.device)

    log_s = log_importance_weights(logp - old_logp, mask_f, "sequence").squeeze(-1)  # (B,) Eq. 44, in log space
    s = torch.exp(log_s)  # (B,)

    lower, upper = 1.0 - epsilon_low, 1.0 + epsilon_high
    # Eq. 47: A >= 0 takes min(s, c), which is the bound only above it; A < 0 takes max(s, c),
    # the bound only below it. Clipped sequences sit on a constant and get no gradient.
    clipped_high = (adv >= 0) & (s > upper)  # (B,)
    clipped_low = (adv < 0) & (s < lower)  # (B,)
    clipped = clipped_high | clipped_low  # (B,)
    s_det = s.detach()  # (B,)
    s_bar = torch.where(
        clipped_high,
        torch.full_like(s_det, upper),
        torch.where(clipped_low, torch.full_like(s_det, lower), s_det),
    )  # (B,) Eq. 47, values only

    s_til = group_transform(s_bar, adv, group_ids, transform, orth_floor=orth_floor)  # (B,) sg

    # exp(log s_bar - sg(log s_bar)): value exactly 1, gradient d log s for unclipped sequences,
    # 0 for clipped ones, so loss = -A sg(s_til / s_bar) s_bar in value and gradient.
    log_factor = torch.where(clipped, torch.zeros_like(log_s), log_s - log_s.detach())  # (B,)
    per_seq_loss = -adv * s_til * torch.exp(log_factor)  # (B,)
    per_token_loss = per_seq_loss.unsqueeze(-1)  # (B, 1)

    with torch.no_grad():
        count = torch.tensor(float(batch), device=s.device)
        low_frac = ((s_det < lower) & (adv < 0)).to(dtype).sum()  # TRL: below bound with A < 0
        high_frac = ((s_det > upper) & (adv > 0)).to(dtype).sum()  # TRL: above bound with A > 0
        region_frac = (((s_det < lower) & (adv < 0)) | ((s_det > upper) & (adv > 0))).to(dtype).sum()
        shrink = (s_til / s_bar.clamp_min(torch.finfo(dtype).tiny)).sum()  # (87) phi_i summed
        if batch:
            asym_before = _mean_group_variance(s_bar * adv, group_ids)
            asym_after = _mean_group_variance(s_til * adv, group_ids)
        else:
            asym_before = asym_after = torch.tensor(float("nan"))
        metrics = {
            "dfpo/asym_before": asym_before.detach().float(),
            "dfpo/asym_after": asym_after.detach().float(),
            "dfpo/shrink": nan_if_empty(shrink / count.clamp(min=1), count),
            "clip_ratio/low": nan_if_empty(low_frac / count.clamp(min=1), count),
            "clip_ratio/high": nan_if_empty(high_frac / count.clamp(min=1), count),
            "clip_ratio/region": nan_if_empty(region_frac / count.clamp(min=1), count),
        }
    return ObjectiveOutput(per_token_loss=per_token_loss, metrics=metrics)


def symmetric_clip_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_high: float,
) -> ObjectiveOutput:
    """GRPO-fix: token-level ``-A * clip(r, 0, 1 + eps_high)`` for both advantage signs (Eq. 79-80).

    Args:
        per_token_logps: (B, T) current log-probs of the sampled tokens.
        old_per_token_logps: (B, T) behaviour log-probs (treated as constant).
        advantages: (B,), (B, 1) or (B, T).
        mask: (B, T) completion mask.
        epsilon_high: upper clip ``1 + eps_high`` (> 0). There is no lower clip (Eq. 79's 0 never
            binds since ``r > 0``).

    Returns:
        ObjectiveOutput with per_token_loss (B, T) (before masking). Metrics, fractions of masked
        tokens (NaN without a valid token): ``clip_ratio/high`` = ``r > 1 + eps_high`` with
        ``A > 0`` (TRL's semantics, comparable with GRPO runs), ``clip_ratio/low`` = 0 (no lower
        bound), ``clip_ratio/region`` = either, and ``dfpo/sym_clip_ratio`` = ``r > 1 + eps_high``
        for any sign: every token whose gradient the symmetric clip removes (for ``A < 0`` PPO's
        min would have kept it).
    """
    _check_epsilon("epsilon_high", epsilon_high)
    check_token_shapes(per_token_logps, old_per_token_logps, mask)
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

    with torch.no_grad():
        above = (ratio > upper).to(dtype)  # (B, T)
        adv_full = adv.expand_as(ratio)  # (B, T)
        high = above * (adv_full > 0).to(dtype)  # (B, T)
        count = mask_f.sum()
        metrics = {
            # per-token indicators (reduced token-weighted over processes by the trainer); no lower bound, low is 0
            "clip_ratio/low": torch.zeros_like(high, dtype=torch.float32) * mask_f,  # (B, T)
            "clip_ratio/high": (high * mask_f).float(),  # (B, T)
            "clip_ratio/region": (high * mask_f).float(),  # (B, T)
            "dfpo/sym_clip_ratio": nan_if_empty(masked_sum(above, mask_f) / count.clamp(min=1), count),
        }
    return ObjectiveOutput(per_token_loss=per_token_loss, metrics=metrics)
