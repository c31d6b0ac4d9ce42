"""OTB: the Optimal Token Baseline (Li et al., arXiv:2602.07078), the pure-torch core. The equations needed to check
this code and every deviation from the paper and from verl's reference estimators are in `docs/otb.md`::

    e_t  = ||onehot(y_t) - p_t||^2 = 1 - 2 p_t(y_t) + sum_v p_t(v)^2    energy (Prop. 4.2), p = softmax(logits / T)
    W_t  = sum_{j <= t} mask_j w_j^2 e_j                               realized energy (Def. 3.1), w: rollout IS
    b_t  = sum_i mask_it W_it G_i / (sum_i mask_it W_it + 1e-8)        baseline (Thm. 4.1), active members at t
    A_it = (G_i - b_t) * mask_it                                       no std normalisation

``token_positions``: what ``t`` indexes under a tool mask, ``"valid"`` (the t-th generated token) or ``"absolute"``
(the column). ``handle_zero_tail`` zeroes the baseline of a group's unique longest member past the second-longest.
Members without a score (NaN) or a valid token leave their group; near-zero energy and equal-return groups: docs/otb.md.
"""

from __future__ import annotations

from dataclasses import field

import torch
from torch import Tensor

from ...core.common import Groups, check_choice, compute_dtype, energy_from_log_probs
from ...core.estimators import AdvantageEstimator, EstimatorInputs, EstimatorOutput

__all__ = ["OTB_ESTIMATOR", "TOKEN_POSITIONS", "logit_gradient_energy", "otb_advantages", "otb_zero_tail"]

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


def logit_gradient_energy(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, *, chunk_size: int = DEFAULT_ENERGY_CHUNK_SIZE
) -> Tensor:
    """Logit-gradient energy ``e = ||d log softmax(z)_y / dz||^2 = 1 - 2 p_y + sum_v p_v^2``, ``z = logits / T``, from
    (..., V) logits and (...) sampled ids: (...), float32 (float64 for float64 logits), no gradient, at most one
    (chunk_size, V) upcast copy at a time. The tests' reference; the trainer uses `energy_from_log_probs`."""
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
        out[start:end] = energy_from_log_probs(log_p_y, log_sum_sq)  # (c,)
    return out.view(token_ids.shape)  # (...)


def otb_advantages(
    rewards: Tensor,
    energy: Tensor,
    mask: Tensor,
    groups: Groups,
    *,
    handle_zero_tail: bool = False,
    token_positions: str = "valid",
    importance_weights: Tensor | None = None,
    check_values: bool = False,
) -> Tensor:
    """OTB advantages ``A_it = (G_i - b_t) * mask_it`` (the module docstring; `docs/otb.md`): (B, T), detached, 0 at
    masked positions and on rows with a NaN (unscorable) reward; ``importance_weights``: rollout IS weights w
    (energies become w^2 e). ``check_values`` (debug) also rejects +-inf rewards and non-finite or negative
    energies; off by default, as reading values stalls a GPU (the trainer checks rewards once per batch).
    """
    shapes = [tuple(t.shape) for t in (energy, mask, importance_weights) if t is not None]  # one (B, T) shape
    if rewards.dim() != 1 or energy.dim() != 2 or energy.shape[0] != rewards.shape[0] or len(set(shapes)) > 1:
        raise ValueError(
            f"rewards must be (B,) and energy, mask, importance_weights one (B, T) shape, got {tuple(rewards.shape)}, "
            f"{shapes}"
        )
    groups = groups.covering(rewards.shape[0])

    dtype = compute_dtype(rewards, energy, importance_weights)
    returns = rewards.detach().to(dtype)  # (B,)
    scored = ~torch.isnan(returns)  # (B,)
    returns = torch.where(scored, returns, torch.zeros_like(returns))  # (B,)
    active = (mask != 0) & scored.unsqueeze(-1)  # (B, T)
    # A member needs a score and a valid token: the others leave their group (verl's tool-use estimator drops
    # rows without a valid token the same way)
    member = active.any(-1)  # (B,)
    e = energy.detach().to(dtype)  # (B, T)
    if importance_weights is not None:
        e = e * importance_weights.detach().to(dtype).square()  # (B, T) w^2 e
    # `where`, not `* mask`: garbage (NaN) energies at padding must not leak into the cumsum
    e = torch.where(active, e, torch.zeros_like(e))  # (B, T)
    if check_values:  # the debug mode: these read the device
        if torch.isinf(rewards).any():
            raise ValueError("rewards must be finite or NaN (NaN = unscorable); got +-inf")
        if not torch.isfinite(e).all():
            raise ValueError("energy (times importance_weights^2) must be finite at valid positions")
        if (e < -_NEGATIVE_ENERGY_TOLERANCE).any():
            raise ValueError("energy must be >= 0 (it is a squared gradient norm)")
    e = e.clamp_min(0.0)  # (B, T) rounding of 1 - 2p + sum p^2 only

    order = None
    if token_positions == "valid":
        # Compact each row's valid tokens to the left: column k is then its k-th valid token, and the rest of
        # the computation below is the absolute-position estimator on right-padded rows.
        order = torch.sort((~active).to(torch.int8), dim=-1, stable=True).indices  # (B, T) valid ones first
        e, active = e.gather(-1, order), active.gather(-1, order)  # (B, T) each

    shared = groups.rows(member.to(torch.int64), "sum") > 1  # (B,) the row's group has two or more members
    baseline = _token_baseline(e, active, returns, shared, groups)  # (B, T)
    if handle_zero_tail:
        baseline = _zero_tail(baseline, active, member, shared, groups)  # (B, T)
    # the members of a group of two or more with one return for all train nothing (active implies member)
    lowest = groups.rows(torch.where(member, returns, torch.full_like(returns, torch.inf)), "amin")  # (B,)
    highest = groups.rows(torch.where(member, returns, torch.full_like(returns, -torch.inf)), "amax")  # (B,)
    trains = active & ~(shared & (lowest == highest)).unsqueeze(-1)  # (B, T)
    advantages = torch.where(trains, returns.unsqueeze(-1) - baseline, torch.zeros_like(baseline))  # (B, T)
    if order is not None:  # back to the columns of the input
        advantages = torch.empty_like(advantages).scatter_(-1, order, advantages)  # (B, T)
    return advantages


def _token_baseline(e: Tensor, active: Tensor, returns: Tensor, shared: Tensor, groups: Groups) -> Tensor:
    """(B, T) ``b_t`` of each row's group (Theorem 4.1) over its members active at ``t``; the plain mean of their
    returns where their summed energy is at most `MIN_SUMMED_ENERGY`; 0 for a group of one."""
    cum_energy = e.cumsum(-1)  # (B, T) W_t, including t (e is 0 off the mask)
    weight = torch.where(active, cum_energy, torch.zeros_like(cum_energy))  # (B, T) mask_t W_t
    numer = groups.reduce(weight * returns.unsqueeze(-1), "sum")  # (K, T)
    denom = groups.reduce(weight, "sum")  # (K, T)
    weighted = numer / (denom + 1e-8)  # (K, T) the reference's 1e-8
    count = groups.reduce(active.to(weight.dtype), "sum").clamp_min(1.0)  # (K, T) active members
    plain = groups.reduce(torch.where(active, returns.unsqueeze(-1), torch.zeros_like(weight)), "sum") / count
    baseline = groups.broadcast(torch.where(denom > MIN_SUMMED_ENERGY, weighted, plain))  # (B, T)
    # A group of one member has nothing to compare with: baseline 0 (verl: N == 1)
    return torch.where(shared.unsqueeze(-1), baseline, torch.zeros_like(baseline))  # (B, T)


def _zero_tail(baseline: Tensor, active: Tensor, member: Tensor, shared: Tensor, groups: Groups) -> Tensor:
    """`baseline` with 0 on a group's unique longest member past the second-longest valid-token count (verl)."""
    # verl: lengths are valid-token counts; non-members get -1 so they never rank
    lengths = torch.where(member, active.sum(-1), torch.full_like(member, -1, dtype=torch.int64))  # (B,)
    longest = groups.rows(lengths, "amax")  # (B,)
    is_longest = member & (lengths == longest)  # (B,)
    n_longest = groups.rows(is_longest.to(torch.int64), "sum")  # (B,)
    second = groups.rows(torch.where(is_longest, torch.full_like(lengths, -1), lengths), "amax")  # (B,)
    unique_longest = is_longest & (n_longest == 1) & shared  # (B,)
    positions = torch.arange(baseline.shape[1], device=baseline.device)  # (T,)
    tail = unique_longest.unsqueeze(-1) & (positions >= second.unsqueeze(-1))  # (B, T)
    return torch.where(tail, torch.zeros_like(baseline), baseline)  # (B, T)


def _validate_otb_knobs(*, otb_token_positions: str, otb_handle_zero_tail: bool | None) -> None:
    check_choice("otb_token_positions", otb_token_positions, TOKEN_POSITIONS)
    if otb_handle_zero_tail not in (None, True, False):
        raise ValueError(
            "otb_handle_zero_tail must be True, False or None (None: on for tool-use batches only), "
            f"got {otb_handle_zero_tail!r}."
        )


def otb_zero_tail(otb_handle_zero_tail: bool | None, tool_use: bool) -> bool:
    """`otb_handle_zero_tail`, `None` resolved per batch: on for tool-use batches (verl's two estimators' defaults)."""
    return tool_use if otb_handle_zero_tail is None else bool(otb_handle_zero_tail)


def _otb(inputs: EstimatorInputs, *, otb_token_positions: str, otb_handle_zero_tail: bool | None) -> EstimatorOutput:
    """OTB's advantages `G_i - b_t`, and (B, T) metrics averaged over the scored valid tokens (padding's non-finite
    values never reach a sum). The mechanism shows as `otb/grad_second_moment`, E[A^2 ||grad log p||^2] with the
    energy as the squared norm, below `otb/grad_second_moment_group_mean_baseline` (the group-mean baseline's)."""
    rewards, energy, mask, groups = inputs.rewards, inputs.energy, inputs.mask, inputs.groups()
    advantages = otb_advantages(
        rewards,
        energy,
        mask,
        groups,
        handle_zero_tail=otb_zero_tail(otb_handle_zero_tail, inputs.tool_use),
        token_positions=otb_token_positions,
        importance_weights=inputs.importance_weights,
    )  # (B, T)
    valid = (mask != 0) & (~torch.isnan(rewards)).unsqueeze(1)  # (B, T)
    returns = torch.nan_to_num(rewards).unsqueeze(1)  # (B, 1)
    group_adv = returns - groups.rows(returns, "mean")  # (B, 1)
    per_token = {
        "otb/energy_mean": energy,
        "otb/baseline_mean": returns - advantages,  # b_t where valid
        "otb/adv_abs_mean": advantages.abs(),
        "otb/grad_second_moment": advantages**2 * energy,
        "otb/grad_second_moment_group_mean_baseline": group_adv**2 * energy,
    }  # (B, T) each
    metrics = {name: torch.where(valid, value.detach(), torch.zeros_like(value)) for name, value in per_token.items()}
    return EstimatorOutput(advantages, metrics, valid.to(energy.dtype))


_POSITIONS_METADATA = {
    "help": "advantage_estimator='otb': position index of the baseline under a tool mask: 'valid' (k-th generated "
    "token, verl's tool-use estimator) or 'absolute' (column index, verl's single-turn estimator). Identical without "
    "holes.",
    "choices": list(TOKEN_POSITIONS),
}
_ZERO_TAIL_HELP = (
    "advantage_estimator='otb': baseline 0 on a group's unique longest completion past the second-longest. Default "
    "(unset): on for tool-use batches (tool_mask), off otherwise, as verl's two estimators."
)
#: The "otb" advantage estimator, which every method config may select (OTB's spec names it: `spec.py`).
OTB_ESTIMATOR = AdvantageEstimator(
    name="otb",
    estimate=_otb,
    summary="the optimal token baseline: A_it = G_i - b_t on the raw rewards, b_t weighted by the "
    "logit-gradient energy (arXiv:2602.07078)",
    knobs=("otb_token_positions", "otb_handle_zero_tail"),
    config_fields=(
        ("otb_token_positions", str, field(default="valid", metadata=_POSITIONS_METADATA)),
        ("otb_handle_zero_tail", bool | None, field(default=None, metadata={"help": _ZERO_TAIL_HELP})),
    ),
    validate=_validate_otb_knobs,
    needs_raw_rewards=True,
    needs_whole_groups=True,
    needs_energy=True,
    per_token=True,
)
