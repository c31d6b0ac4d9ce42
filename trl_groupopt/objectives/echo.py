r"""ECHO: clip at batch, learn at token (arXiv "ECHO", Eq. 5-11, 34; App. A.2). With
``log r_{i,t} = (log pi_theta - log pi_old)(o_{i,t}) * mask`` (Eq. 5) and ``N = sum(mask)``::

    R      = exp( sum_{i,t} log r_{i,t} / N )              (Eq. 6, geometric, keeps its gradient)
    R_bar  = clip(R, 1 - eps_b_low, 1 + eps_b_high)        (Eq. 7)
    C      = R_bar / sg(R)                                 (Eq. 8; value 1 unless R is clipped)
    rho    = r * C                                         (Eq. 8-10, effective token ratio)
    loss   = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)      (Eq. 11)

``token_clip=False`` drops the token clip (``-rho * A``); the trainer's per-token multipliers ``w`` (vLLM IS weights,
off-policy and entropy masks) give ``w * loss``, R unchanged. Unclipped and unweighted the gradient is Eq. 34,
``C (1/N) (A r + L) mask`` with ``L = (1/N) sum r A``: every token carries the coupling ``L`` through ``log R``.

Scopes of R: this micro-batch (``log_ratio_sum=None``), or wider: R's value from detached totals over processes or
the optimizer step's micro-batches (`echo_log_ratio_totals`) while the local tokens keep their graph, and
``coupling_sum`` (the parts' summed `echo_batch_ratio_coupling`) supplies the others' share of ``L``, so the summed
gradient is that of the objective over the union. Derivations, the Eq. 15 vs Eq. 34 discrepancy, the coupling's
exactness conditions and the log-rho cap: docs/echo.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from .common import (
    ObjectiveOutput,
    as_token_advantages,
    check_positive,
    check_token_inputs,
    compute_dtype,
    named,
    nan_if_empty,
)

MAX_LOG_RHO = 60.0  # cap on log(rho) before exp: rho <= 1.1e26, finite float32 loss and gradient (docs/echo.md)


def masked_log_ratio(per_token_logps: Tensor, old_per_token_logps: Tensor, mask: Tensor) -> Tensor:
    """(B, T) ``log r = logp - old`` on valid tokens, exactly 0 elsewhere (`where`, not ``* mask``: padding
    log-probs may be non-finite, and ``nan * 0`` is NaN)."""
    dtype = compute_dtype(per_token_logps)
    logp = per_token_logps.to(dtype)  # (B, T)
    diff = logp - old_per_token_logps.to(dtype).detach()  # (B, T)
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


def echo_log_ratio_totals(per_token_logps: Tensor, old_per_token_logps: Tensor, mask: Tensor) -> Tensor:
    """(2,) detached ``[sum log r, sum mask]`` of one part, masked as the loss masks them: summed over the parts,
    `echo_loss`'s ``log_ratio_sum`` / ``token_count``."""
    log_r = masked_log_ratio(per_token_logps.detach(), old_per_token_logps, mask)  # (B, T)
    return torch.stack([log_r.sum(), mask.bool().sum().to(log_r.dtype)])


def _token_weights(weights: Tensor | None, shape: torch.Size, dtype: torch.dtype) -> Tensor | None:
    """The loss weights, detached in the compute dtype: (B, T) or (B, 1), checked against the (B, T) mask."""
    if weights is None:
        return None
    batch, length = shape
    if weights.dim() != 2 or weights.shape[0] != batch or weights.shape[1] not in (1, length):
        raise ValueError(f"importance_weights must be ({batch}, {length}) or ({batch}, 1), got {tuple(weights.shape)}")
    return weights.detach().to(dtype)


def _batch_log_bounds(batch_epsilon_low: float, batch_epsilon_high: float) -> tuple[float, float]:
    """log(1 - eps_b_low), log(1 + eps_b_high); eps_b_low >= 1 means no lower bound (R > 0)."""
    low = math.log1p(-batch_epsilon_low) if batch_epsilon_low < 1 else -math.inf
    return low, math.log1p(batch_epsilon_high)


def _surrogate(
    log_r: Tensor,
    log_ratio: Tensor,
    advantages: Tensor,
    valid: Tensor,
    weights: Tensor | None,
    *,
    epsilon_low: float,
    epsilon_high: float,
    batch_bounds: tuple[float, float],
    token_clip: bool,
) -> tuple[Tensor, Tensor]:
    """Per-token ECHO loss (Eq. 7-11) given the token log-ratios and log R, times the loss weights (None: 1).
    Returns (loss, rho)."""
    log_ratio_bar = log_ratio.clamp(min=batch_bounds[0], max=batch_bounds[1])  # () log R_bar, Eq. 7
    log_c = log_ratio_bar - log_ratio.detach()  # () log C = log R_bar - sg(log R), Eq. 8
    log_rho = (log_r + log_c).clamp(max=MAX_LOG_RHO)  # (B, T) overflow guard, see module doc
    rho = torch.exp(log_rho)  # (B, T) effective token ratio, Eq. 10
    if token_clip:
        clipped = rho.clamp(min=1 - epsilon_low, max=1 + epsilon_high)  # (B, T)
        loss = -torch.min(rho * advantages, clipped * advantages)  # (B, T) Eq. 11
    else:
        loss = -rho * advantages  # (B, T) batch clip only
    if weights is not None:
        loss = loss * weights  # (B, T) the trainer's per-token multipliers (constants)
    return torch.where(valid, loss, torch.zeros_like(loss)), rho  # (B, T), (B, T)


class _Prepared:
    """Upcast inputs, token log-ratios, loss weights and log R (with the scope's stop-gradients)."""

    def __init__(
        self,
        per_token_logps: Tensor,
        old_per_token_logps: Tensor,
        advantages: Tensor,
        mask: Tensor,
        log_ratio_sum: Tensor | float | None,
        token_count: Tensor | float | None,
        importance_weights: Tensor | None,
    ) -> None:
        check_token_inputs(per_token_logps, old_per_token_logps, mask, advantages)
        if (log_ratio_sum is None) != (token_count is None):
            raise ValueError("log_ratio_sum and token_count must be given together (wider scope) or both None")
        dtype = compute_dtype(per_token_logps)
        self.valid = mask.bool()  # (B, T)
        self.log_r = masked_log_ratio(per_token_logps, old_per_token_logps, mask)  # (B, T) with gradient
        device = self.log_r.device
        self.advantages = as_token_advantages(advantages.to(dtype).detach())  # (B, 1) or (B, T)
        self.weights = _token_weights(importance_weights, mask.shape, dtype)  # (B, T), (B, 1) or None
        self.num_valid = self.valid.sum()  # () local valid tokens
        local_sum = self.log_r.sum()  # () keeps the graph to the local tokens
        if log_ratio_sum is None:
            self.global_scope = False
            self.count = self.num_valid.to(dtype)  # ()
            total = local_sum  # ()
        else:
            self.global_scope = True
            self.count = torch.as_tensor(token_count, dtype=dtype, device=device).detach().reshape(())
            global_sum = torch.as_tensor(log_ratio_sum, dtype=dtype, device=device).detach().reshape(())
            total = local_sum + (global_sum - local_sum.detach())  # () value global, grad local
        self.log_ratio = total / self.count.clamp(min=1.0)  # () log R, Eq. 6


def validate_echo(
    *,
    epsilon_low: float,
    epsilon_high: float,
    batch_epsilon_low: float,
    batch_epsilon_high: float,
    names: Mapping[str, str] | None = None,
) -> None:
    """Raise unless every clip width is > 0 (`ECHOConfig` checks its fields with it, once; `names`: what the caller
    calls each argument, see `common.named`). ``batch_epsilon_low >= 1`` is allowed here: no lower batch
    bound."""
    check_positive(
        **named(
            names,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            batch_epsilon_low=batch_epsilon_low,
            batch_epsilon_high=batch_epsilon_high,
        )
    )


def _surrogate_kwargs(
    epsilon_low: float, epsilon_high: float, batch_epsilon_low: float, batch_epsilon_high: float, token_clip: bool
) -> dict:
    """Keyword arguments of `_surrogate` (shared by the loss and the coupling; `validate_echo` states their rules)."""
    return dict(
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        batch_bounds=_batch_log_bounds(batch_epsilon_low, batch_epsilon_high),
        token_clip=token_clip,
    )


def _local_coupling(prep: _Prepared, **surrogate_kwargs) -> Tensor:
    """sum over local valid tokens of d loss_{i,t} / d log R (detached, by autograd on a leaf log R)."""
    with torch.enable_grad():
        leaf = prep.log_ratio.detach().clone().requires_grad_(True)  # ()
        loss, _ = _surrogate(prep.log_r.detach(), leaf, prep.advantages, prep.valid, prep.weights, **surrogate_kwargs)
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return grad.detach()


def echo_batch_ratio_coupling(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    batch_epsilon_low: float,
    batch_epsilon_high: float,
    token_clip: bool = True,
    log_ratio_sum: Tensor | float | None = None,
    token_count: Tensor | float | None = None,
    importance_weights: Tensor | None = None,
) -> Tensor:
    """This part's coupling ``sum_{i,t} mask * w * d loss_{i,t} / d log R`` (0-dim, detached; 0 when R is clipped):
    summed over the parts that form R, it is `echo_loss`'s ``coupling_sum`` (same arguments)."""
    kwargs = _surrogate_kwargs(epsilon_low, epsilon_high, batch_epsilon_low, batch_epsilon_high, token_clip)
    prep = _Prepared(
        per_token_logps, old_per_token_logps, advantages, mask, log_ratio_sum, token_count, importance_weights
    )
    return _local_coupling(prep, **kwargs)


def echo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    batch_epsilon_low: float,
    batch_epsilon_high: float,
    token_clip: bool = True,
    log_ratio_sum: Tensor | float | None = None,
    token_count: Tensor | float | None = None,
    coupling_sum: Tensor | float | None = None,
    importance_weights: Tensor | None = None,
) -> ObjectiveOutput:
    """ECHO per-token loss (Eq. 6-11; the module docstring, docs/echo.md). `validate_echo` states the rules of the
    clip widths (`ECHOConfig` runs it once).

    Args:
        per_token_logps, old_per_token_logps, mask: (B, T) current and behaviour log-probs (the latter constant),
            0/1 completion mask.
        advantages: (B,) or (B, T).
        epsilon_low, epsilon_high, batch_epsilon_low, batch_epsilon_high: the token clip (Eq. 11) and R's (Eq. 7).
        token_clip: False gives ``loss = -rho * A`` (batch clip only).
        log_ratio_sum, token_count: detached totals over the set that forms R (`echo_log_ratio_totals` summed over
            its parts); None: R over this micro-batch.
        coupling_sum: `echo_batch_ratio_coupling` summed over the same parts (needs the totals).
        importance_weights: (B, T) or (B, 1) constant loss multipliers ``w``; None: 1. Pass the same to
            `echo_batch_ratio_coupling`; R stays Eq. 6 over every token of ``mask``.

    Returns:
        ObjectiveOutput: per_token_loss (B, T) (0 where mask is 0); metrics "echo/batch_ratio" (R),
        "echo/batch_clipped" (0/1), "clip_ratio/low|high|region" (token clip of rho; 0 without it). NaN if undefined.
    """
    kwargs = _surrogate_kwargs(epsilon_low, epsilon_high, batch_epsilon_low, batch_epsilon_high, token_clip)
    prep = _Prepared(
        per_token_logps, old_per_token_logps, advantages, mask, log_ratio_sum, token_count, importance_weights
    )
    if coupling_sum is not None and not prep.global_scope:
        raise ValueError("coupling_sum is only meaningful with log_ratio_sum and token_count (global scope)")
    loss, rho = _surrogate(prep.log_r, prep.log_ratio, prep.advantages, prep.valid, prep.weights, **kwargs)  # (B, T)

    if coupling_sum is not None and prep.log_ratio.requires_grad:
        # Supply the other parts' d loss / d log R through this part's log R graph; the term's
        # value is exactly 0 (x - sg(x)), only its gradient counts (docs/echo.md).
        total = torch.as_tensor(coupling_sum, dtype=loss.dtype, device=loss.device).detach().reshape(())
        missing = total - _local_coupling(prep, **kwargs)  # ()
        extra = missing * (prep.log_ratio - prep.log_ratio.detach()) / prep.num_valid.clamp(min=1)  # ()
        loss = loss + torch.where(prep.valid, extra, torch.zeros_like(loss))  # (B, T)

    with torch.no_grad():
        low_b, high_b = kwargs["batch_bounds"]
        log_ratio = prep.log_ratio.detach()  # ()
        batch_ratio = nan_if_empty(log_ratio.exp(), prep.count)
        batch_clipped = nan_if_empty((log_ratio < low_b) | (log_ratio > high_b), prep.count)
        adv = prep.advantages.expand_as(rho)  # (B, T)
        if token_clip:
            is_low = (rho < 1 - epsilon_low) & (adv < 0) & prep.valid  # (B, T)
            is_high = (rho > 1 + epsilon_high) & (adv > 0) & prep.valid  # (B, T)
        else:
            is_low = is_high = torch.zeros_like(prep.valid)  # (B, T) nothing is token-clipped
        metrics = {
            "echo/batch_ratio": batch_ratio,
            "echo/batch_clipped": batch_clipped,
            # per-token indicators: the trainer reduces them over processes token-weighted, as TRL does
            "clip_ratio/low": is_low.float(),  # (B, T)
            "clip_ratio/high": is_high.float(),  # (B, T)
            "clip_ratio/region": (is_low | is_high).float(),  # (B, T)
        }
    return ObjectiveOutput(per_token_loss=loss, metrics=metrics)
