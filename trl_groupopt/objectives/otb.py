"""OTB: the Optimal Token Baseline (Li et al., arXiv:2602.07078), the pure-torch core. The equations needed to check
this code and every deviation from the paper and from verl's reference estimators are in `docs/otb.md`::

    e_t  = ||onehot(y_t) - p_t||^2 = 1 - 2 p_t(y_t) + sum_v p_t(v)^2    energy (Prop. 4.2), p = softmax(logits / T)
    W_t  = sum_{j <= t} mask_j w_j^2 e_j                               realized energy (Def. 3.1), w: rollout IS
    b_t  = sum_i mask_it W_it G_i / (sum_i mask_it W_it + 1e-8)        baseline (Thm. 4.1), active members at t
    A_it = (G_i - b_t) * mask_it                                       no std normalisation

``token_positions``: what ``t`` indexes when a mask has holes (tool results): ``"valid"``, the t-th *generated* token
of every member (verl's tool-use estimator), or ``"absolute"``, the column (its single-turn one). ``handle_zero_tail``
zeroes the baseline of a group's unique longest member past the second-longest, where it would be compared with
itself. Members without a score (NaN reward) or a valid token leave their group; a group of one has baseline 0. Where
a position's summed energy is ~0, ``b_t`` is the plain mean of the active returns (not 0 through the 1e-8), and a
group whose returns are all equal gets advantage exactly 0 (both against verl, docs/otb.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import Groups, as_groups, compute_dtype

__all__ = ["TOKEN_POSITIONS", "energy_from_log_probs", "logit_gradient_energy", "otb_advantages"]

# Rows of logits upcast to float32 at a time: 256 x 152k vocabulary is ~155 MB per temporary.
DEFAULT_ENERGY_CHUNK_SIZE = 256
# Energies below 0 by more than this are a caller bug, not rounding of 1 - 2p + sum p^2.
_NEGATIVE_ENERGY_TOLERANCE = 1e-3
#: What the position index t of the baseline b_t counts (module docstring).
TOKEN_POSITIONS = ("valid", "absolute")
#: Summed realized energy of a position's active members at or below which b_t is their plain mean (the equal-weights
#: limit). float32 resolves each e = 1 - 2p + sum p^2 only to ~1e-7, so weights this small are rounding noise, and the
#: 1e-8 in the denominator would shrink b_t toward 0 (by 1% at 1e-6, by half at 1e-8).
MIN_SUMMED_ENERGY = 1e-6


def _energy(log_p_y: Tensor, log_sum_sq: Tensor) -> Tensor:
    """e = 1 - 2 p_y + sum_v p_v^2 from log p_y and log sum_v p_v^2; clamped at 0 (``p_y ~ 1`` can round below)."""
    return (1.0 - 2.0 * log_p_y.exp() + log_sum_sq.exp()).clamp_min(0.0)


def logit_gradient_energy(
    logits: Tensor,
    token_ids: Tensor,
    temperature: float = 1.0,
    *,
    chunk_size: int = DEFAULT_ENERGY_CHUNK_SIZE,
) -> Tensor:
    """Logit-gradient energy ``e = ||d log softmax(z)_y / dz||^2 = 1 - 2 p_y + sum_v p_v^2`` from (..., V) logits of
    the rollout policy and (...) sampled ids, ``z = logits / temperature``; (...) energies, float32 (float64 for
    float64 logits), without gradient. At most a (chunk_size, V) upcast copy of the logits exists at a time. The
    trainer reads the energy from TRL's fused head instead (`energy_from_log_probs`); this is the tests' reference.
    """
    if not logits.is_floating_point() or token_ids.shape != logits.shape[:-1] or token_ids.is_floating_point():
        raise ValueError(
            f"logits must be float (..., V) and token_ids integer (...): got {logits.dtype} {tuple(logits.shape)}, "
            f"{token_ids.dtype} {tuple(token_ids.shape)}"
        )
    if not temperature > 0 or chunk_size < 1:
        raise ValueError(f"temperature must be > 0 and chunk_size >= 1, got {temperature}, {chunk_size}")
    vocab = logits.shape[-1]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
        raise ValueError(f"token_ids must lie in [0, {vocab}) (mask ignored positions with a valid id)")

    dtype = compute_dtype(logits)
    with torch.no_grad():
        flat = logits.detach().reshape(-1, vocab)  # (N, V), input dtype; a view when contiguous
        ids = token_ids.reshape(-1, 1)  # (N, 1)
        out = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)  # (N,)
        for start in range(0, flat.shape[0], chunk_size):
            end = min(start + chunk_size, flat.shape[0])
            z = flat[start:end].to(dtype, copy=True)  # (c, V) the only upcast copy
            z.div_(temperature)  # (c, V) in place: no second full-width copy
            lse = torch.logsumexp(z, dim=-1)  # (c,)
            log_sum_sq = torch.logsumexp(2.0 * z, dim=-1) - 2.0 * lse  # (c,) log sum_v p_v^2
            log_p_y = z.gather(-1, ids[start:end]).squeeze(-1) - lse  # (c,)
            out[start:end] = _energy(log_p_y, log_sum_sq)  # (c,)
    return out.view(token_ids.shape)  # (...)


def energy_from_log_probs(per_token_logps: Tensor, log_sum_sq_probs: Tensor) -> Tensor:
    """The same energy, (B, T) and detached, from TRL's fused LM head: its ``log_probs`` and ``log_sum_sq_probs`` (both 0
    where the label is -100, which gives energy 0 there)."""
    if per_token_logps.shape != log_sum_sq_probs.shape:
        raise ValueError(
            f"per_token_logps {tuple(per_token_logps.shape)} and log_sum_sq_probs "
            f"{tuple(log_sum_sq_probs.shape)} differ"
        )
    dtype = compute_dtype(per_token_logps, log_sum_sq_probs)
    return _energy(per_token_logps.detach().to(dtype), log_sum_sq_probs.detach().to(dtype))  # (B, T)


def _valid_first_order(active: Tensor) -> Tensor:
    """(B, T) per-row stable permutation putting each row's valid positions first: gathering with it compacts the
    valid tokens to the left (column k = the k-th valid token), scattering with it puts them back."""
    return torch.sort((~active).to(torch.int8), dim=-1, stable=True).indices  # (B, T)


def otb_advantages(
    rewards: Tensor,
    energy: Tensor,
    mask: Tensor,
    groups: Groups | Tensor,
    *,
    handle_zero_tail: bool = False,
    token_positions: str = "valid",
    importance_weights: Tensor | None = None,
    epsilon: float = 1e-8,
    check_values: bool = False,
) -> Tensor:
    """OTB advantages ``A_it = (G_i - b_t) * mask_it`` (the module docstring; `docs/otb.md`).

    Args:
        rewards: (B,) raw outcome rewards G_i (weighted sum over reward sources, uncentred); NaN: unscorable.
        energy: (B, T) per-token energy e_t >= 0 (`energy_from_log_probs`).
        mask: (B, T) loss mask: nonzero at generated tokens trained on, zero at padding and tool results.
        groups: the trainer's `common.Groups.contiguous(B, num_generations)` (reads nothing from the device), or (B,)
            integer group ids in any order.
        handle_zero_tail, token_positions: the module docstring (verl defaults the first to True for tool use only).
        importance_weights: optional (B, T) rollout importance weights w; energies become w^2 e.
        epsilon: added to the denominator of b_t (1e-8 as in the reference).
        check_values: also raise on +-inf rewards and on non-finite or negative energies at valid positions. Off by
            default: reading values stalls a GPU; the trainer checks the rewards once per generation batch
            (`checks.check_finite_rewards`), and its energies are non-negative by construction.

    Returns:
        (B, T) advantages, detached, float32 (float64 if any input is float64); 0 at masked positions and on rows
        with a NaN reward. `token_positions` is checked once, by the estimator's config validation.
    """
    _check_inputs(rewards, energy, mask, importance_weights)
    groups = as_groups(groups, rewards.shape[0])

    dtype = compute_dtype(rewards, energy, importance_weights)
    with torch.no_grad():
        returns = rewards.detach().to(dtype)  # (B,)
        scored = ~torch.isnan(returns)  # (B,)
        returns = torch.where(scored, returns, torch.zeros_like(returns))  # (B,)
        active = (mask != 0) & scored.unsqueeze(-1)  # (B, T)
        # A member needs a score and a valid token: the others leave their group (verl's tool-use estimator drops
        # rows without a valid token the same way)
        member = active.any(-1)  # (B,)
        e = _active_energy(energy, importance_weights, active, dtype)  # (B, T)
        if check_values:
            _check_values(rewards, e)
        e = e.clamp_min(0.0)  # (B, T) rounding of 1 - 2p + sum p^2 only

        order = None
        if token_positions == "valid":
            # Compact each row's valid tokens to the left: column k is then its k-th valid token, and the rest of
            # the computation below is the absolute-position estimator on right-padded rows.
            order = _valid_first_order(active)  # (B, T)
            e, active = e.gather(-1, order), active.gather(-1, order)  # (B, T) each

        baseline = _token_baseline(e, active, returns, member, groups, epsilon)  # (B, T)
        if handle_zero_tail:
            baseline = _zero_tail(baseline, active, member, groups)  # (B, T)
        trains = active & ~_constant_group(returns, member, groups).unsqueeze(-1)  # (B, T)
        advantages = torch.where(trains, returns.unsqueeze(-1) - baseline, torch.zeros_like(baseline))  # (B, T)
        if order is not None:  # back to the columns of the input
            advantages = torch.empty_like(advantages).scatter_(-1, order, advantages)  # (B, T)
    return advantages


def _check_inputs(rewards: Tensor, energy: Tensor, mask: Tensor, importance_weights: Tensor | None) -> None:
    """Shapes of `otb_advantages`' tensors: rewards (B,), energy, mask and importance weights one (B, T) shape."""
    shapes = [tuple(t.shape) for t in (energy, mask, importance_weights) if t is not None]
    if rewards.dim() != 1 or energy.dim() != 2 or energy.shape[0] != rewards.shape[0] or len(set(shapes)) > 1:
        raise ValueError(
            f"rewards must be (B,) and energy, mask, importance_weights one (B, T) shape, got {tuple(rewards.shape)}, "
            f"{shapes}"
        )


def _check_values(rewards: Tensor, e: Tensor) -> None:
    """`otb_advantages`' ``check_values``: finite-or-NaN rewards, finite non-negative active energies ``e``."""
    if torch.isinf(rewards).any():
        raise ValueError("rewards must be finite or NaN (NaN = unscorable); got +-inf")
    if not torch.isfinite(e).all():
        raise ValueError("energy (times importance_weights^2) must be finite at valid positions")
    if (e < -_NEGATIVE_ENERGY_TOLERANCE).any():
        raise ValueError("energy must be >= 0 (it is a squared gradient norm)")


def _active_energy(energy: Tensor, importance_weights: Tensor | None, active: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, T) ``w^2 e`` on the active tokens, 0 elsewhere (not yet clamped: `_check_values` sees the raw values)."""
    e = energy.detach().to(dtype)  # (B, T)
    if importance_weights is not None:
        e = e * importance_weights.detach().to(dtype).square()  # (B, T) w^2 e
    # `where`, not `* mask`: garbage (NaN) energies at padding must not leak into the cumsum
    return torch.where(active, e, torch.zeros_like(e))  # (B, T)


def _token_baseline(
    e: Tensor, active: Tensor, returns: Tensor, member: Tensor, groups: Groups, epsilon: float
) -> Tensor:
    """(B, T) ``b_t`` of each row's group (Theorem 4.1) over its members active at ``t``; the plain mean of their
    returns where their summed energy is at most `MIN_SUMMED_ENERGY`; 0 for a group of one."""
    cum_energy = e.cumsum(-1)  # (B, T) W_t, including t (e is 0 off the mask)
    weight = torch.where(active, cum_energy, torch.zeros_like(cum_energy))  # (B, T) mask_t W_t
    # Per-group, per-position sums over the active members: (K, T), broadcast back to rows

    def per_group(values: Tensor) -> Tensor:  # (B, T) -> (K, T) sums over each group's rows
        return groups.reduce(values, "sum")

    numer = per_group(weight * returns.unsqueeze(-1))  # (K, T)
    denom = per_group(weight)  # (K, T)
    weighted = numer / (denom + epsilon)  # (K, T)
    count = per_group(active.to(weight.dtype))  # (K, T) active members
    plain = per_group(torch.where(active, returns.unsqueeze(-1), torch.zeros_like(weight))) / count.clamp_min(1.0)
    baseline = groups.broadcast(torch.where(denom > MIN_SUMMED_ENERGY, weighted, plain))  # (B, T)
    # A group of one member has nothing to compare with: baseline 0 (verl: N == 1)
    n_members = groups.rows(member.to(torch.int64), "sum")  # (B,)
    return torch.where(n_members.unsqueeze(-1) > 1, baseline, torch.zeros_like(baseline))  # (B, T)


def _constant_group(returns: Tensor, member: Tensor, groups: Groups) -> Tensor:
    """(B,) whether the row is a member of a group of two or more members that all have the same return."""
    lowest = groups.rows(torch.where(member, returns, torch.full_like(returns, torch.inf)), "amin")  # (B,)
    highest = groups.rows(torch.where(member, returns, torch.full_like(returns, -torch.inf)), "amax")  # (B,)
    n_members = groups.rows(member.to(torch.int64), "sum")  # (B,)
    return member & (n_members > 1) & (lowest == highest)  # (B,)


def _zero_tail(baseline: Tensor, active: Tensor, member: Tensor, groups: Groups) -> Tensor:
    """`baseline` with 0 on a group's unique longest member past the second-longest valid-token count (verl)."""
    # verl: lengths are valid-token counts; non-members get -1 so they never rank
    lengths = torch.where(member, active.sum(-1), torch.full_like(member, -1, dtype=torch.int64))  # (B,)
    longest = groups.rows(lengths, "amax")  # (B,)
    is_longest = member & (lengths == longest)  # (B,)
    n_longest = groups.rows(is_longest.to(torch.int64), "sum")  # (B,)
    n_members = groups.rows(member.to(torch.int64), "sum")  # (B,)
    second = groups.rows(torch.where(is_longest, torch.full_like(lengths, -1), lengths), "amax")  # (B,)
    unique_longest = is_longest & (n_longest == 1) & (n_members > 1)  # (B,)
    positions = torch.arange(baseline.shape[1], device=baseline.device)  # (T,)
    tail = unique_longest.unsqueeze(-1) & (positions >= second.unsqueeze(-1))  # (B, T)
    return torch.where(tail, torch.zeros_like(baseline), baseline)  # (B, T)
