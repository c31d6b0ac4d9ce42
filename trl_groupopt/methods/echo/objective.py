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

R over this micro-batch (``log_ratio_sum=None``) or wider (detached totals, and ``coupling_sum`` for the others' share
of ``L``): the scopes, their exactness, the Eq. 15 vs Eq. 34 discrepancy and the log-rho cap are in docs/echo.md.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ...core.common import (
    ObjectiveOutput,
    as_token_advantages,
    check_token_inputs,
    checked_token_weights,
    clip_indicators,
    compute_dtype,
    masked_log_ratio,
    nan_if_empty,
)

MAX_LOG_RHO = 60.0  # cap on log(rho) before exp: rho <= 1.1e26, finite float32 loss and gradient (docs/echo.md)


def echo_log_ratio_totals(per_token_logps: Tensor, old_per_token_logps: Tensor, mask: Tensor) -> Tensor:
    """(2,) detached ``[sum log r, sum mask]`` of one part, masked as the loss masks them: summed over the parts,
    `echo_loss`'s ``log_ratio_sum`` / ``token_count``."""
    log_r = masked_log_ratio(per_token_logps.detach(), old_per_token_logps, mask)  # (B, T)
    return torch.stack([log_r.sum(), mask.bool().sum().to(log_r.dtype)])


class _Prepared:
    """One `echo_loss` call's upcast inputs, log r, loss weights, log R (with the scope's stop-gradients), settings."""

    def __init__(
        self,
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
    ) -> None:
        low = math.log1p(-batch_epsilon_low) if batch_epsilon_low < 1 else -math.inf  # else no lower bound (R > 0)
        self.batch_bounds = (low, math.log1p(batch_epsilon_high))  # log(1 - eps_b_low), log(1 + eps_b_high)
        self.epsilon_low, self.epsilon_high, self.token_clip = epsilon_low, epsilon_high, token_clip
        check_token_inputs(per_token_logps, old_per_token_logps, mask, advantages)
        if (log_ratio_sum is None) != (token_count is None):
            raise ValueError("log_ratio_sum and token_count must be given together (wider scope) or both None")
        dtype = compute_dtype(per_token_logps)
        self.valid = mask.bool()  # (B, T)
        self.log_r = masked_log_ratio(per_token_logps, old_per_token_logps, mask)  # (B, T) with gradient
        device = self.log_r.device
        self.advantages = as_token_advantages(advantages.to(dtype).detach())  # (B, 1) or (B, T)
        self.weights = checked_token_weights(importance_weights, mask.shape, dtype)  # (B, T), (B, 1) or None
        self.num_valid = self.valid.sum()  # () local valid tokens
        local_sum = self.log_r.sum()  # () keeps the graph to the local tokens
        if log_ratio_sum is None:
            self.count = self.num_valid.to(dtype)  # ()
            total = local_sum  # ()
        else:
            self.count = torch.as_tensor(token_count, dtype=dtype, device=device).detach().reshape(())
            global_sum = torch.as_tensor(log_ratio_sum, dtype=dtype, device=device).detach().reshape(())
            total = local_sum + (global_sum - local_sum.detach())  # () value global, grad local
        self.log_ratio = total / self.count.clamp(min=1.0)  # () log R, Eq. 6

    def surrogate(self, log_r: Tensor, log_ratio: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, rho), (B, T) each: the per-token ECHO loss (Eq. 7-11) from log r and log R, times the loss weights."""
        low, high = self.batch_bounds
        log_c = log_ratio.clamp(min=low, max=high) - log_ratio.detach()  # () log C = log R_bar - sg(log R), Eq. 7-8
        log_rho = (log_r + log_c).clamp(max=MAX_LOG_RHO)  # (B, T) overflow guard, see module doc
        rho = torch.exp(log_rho)  # (B, T) effective token ratio, Eq. 10
        if self.token_clip:
            clipped = rho.clamp(min=1 - self.epsilon_low, max=1 + self.epsilon_high)  # (B, T)
            loss = -torch.min(rho * self.advantages, clipped * self.advantages)  # (B, T) Eq. 11
        else:
            loss = -rho * self.advantages  # (B, T) batch clip only
        if self.weights is not None:
            loss = loss * self.weights  # (B, T) the trainer's per-token multipliers (constants)
        return torch.where(self.valid, loss, torch.zeros_like(loss)), rho  # (B, T), (B, T)

    def coupling(self) -> Tensor:
        """sum over local valid tokens of d loss_{i,t} / d log R (detached, by autograd on a leaf log R)."""
        with torch.enable_grad():
            leaf = self.log_ratio.detach().clone().requires_grad_(True)  # ()
            loss, _ = self.surrogate(self.log_r.detach(), leaf)
            (grad,) = torch.autograd.grad(loss.sum(), leaf)
        return grad.detach()


def echo_batch_ratio_coupling(
    per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor, **settings: Any
) -> Tensor:
    """This part's coupling ``sum_{i,t} mask * w * d loss_{i,t} / d log R`` (0-dim, detached; 0 when R is clipped):
    summed over the parts that form R, it is `echo_loss`'s ``coupling_sum`` (`echo_loss`'s other arguments)."""
    return _Prepared(per_token_logps, old_per_token_logps, advantages, mask, **settings).coupling()


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
    """ECHO per-token loss (Eq. 6-11; the module docstring, docs/echo.md); `ECHOConfig` checks the clip widths
    once. Wider scopes: the parts' summed `echo_log_ratio_totals` (``log_ratio_sum``,
    ``token_count``) and `echo_batch_ratio_coupling` (``coupling_sum``). Returns the (B, T) loss (0 off the mask),
    "echo/batch_ratio" (R), "echo/batch_clipped" (0/1) and TRL's clip indicators of rho.
    """
    widths = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high, batch_epsilon_low=batch_epsilon_low)
    scope = dict(log_ratio_sum=log_ratio_sum, token_count=token_count, importance_weights=importance_weights)
    inputs = (per_token_logps, old_per_token_logps, advantages, mask)
    if coupling_sum is not None and log_ratio_sum is None:
        raise ValueError("coupling_sum is only meaningful with log_ratio_sum and token_count (global scope)")
    prep = _Prepared(*inputs, **widths, batch_epsilon_high=batch_epsilon_high, token_clip=token_clip, **scope)
    loss, rho = prep.surrogate(prep.log_r, prep.log_ratio)  # (B, T) each

    if coupling_sum is not None and prep.log_ratio.requires_grad:
        # Supply the other parts' d loss / d log R through this part's log R graph; the term's
        # value is exactly 0 (x - sg(x)), only its gradient counts (docs/echo.md).
        total = torch.as_tensor(coupling_sum, dtype=loss.dtype, device=loss.device).detach().reshape(())
        missing = total - prep.coupling()  # ()
        extra = missing * (prep.log_ratio - prep.log_ratio.detach()) / prep.num_valid.clamp(min=1)  # ()
        loss = loss + torch.where(prep.valid, extra, torch.zeros_like(loss))  # (B, T)

    low_b, high_b = prep.batch_bounds
    log_ratio = prep.log_ratio.detach()  # ()
    batch_ratio = nan_if_empty(log_ratio.exp(), prep.count)
    batch_clipped = nan_if_empty((log_ratio < low_b) | (log_ratio > high_b), prep.count)
    is_low = (rho < 1 - epsilon_low) & (prep.advantages < 0) & prep.valid & token_clip  # (B, T); none without clip
    is_high = (rho > 1 + epsilon_high) & (prep.advantages > 0) & prep.valid & token_clip  # (B, T)
    metrics = {"echo/batch_ratio": batch_ratio, "echo/batch_clipped": batch_clipped}
    return ObjectiveOutput(per_token_loss=loss, metrics=metrics | clip_indicators(is_low, is_high))
