r"""ECHO: clip at batch, learn at token (paper 000, Eq. 5-15 and App. A.2; SPEC section 2).

With ``log r_{i,t} = (log pi_theta - log pi_old)(o_{i,t}) * mask`` (Eq. 5) and ``N = sum(mask)``:

    R      = exp( sum_{i,t} log r_{i,t} / N )              (Eq. 6, geometric, keeps its gradient)
    R_bar  = clip(R, 1 - eps_b_low, 1 + eps_b_high)        (Eq. 7)
    C      = R_bar / sg(R)                                 (Eq. 8; value 1 unless R is clipped)
    rho    = r * C                                         (Eq. 8-10, effective token ratio)
    loss   = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)      (Eq. 11)

``token_clip=False`` drops the token-level min/clip (``loss = -rho * A``): the pure batch clip
of the abstract ("this single clipping bound"). The trainer aggregates with ``loss_type="dapo"``
(1 / sum|o_i|, Eq. 11).

Gradient (unclipped region). With ``L = (1/N) sum r A`` and ``J = (1/N) sum rho A``, autograd gives

    dJ / d logp_{i,t} = C (1/N) (A_{i,t} r_{i,t} + L) mask_{i,t}                     (Eq. 34)

because ``grad log R = (1/N) sum grad log pi`` holds exactly for the geometric R of Eq. 6.
App. A.2 defines R as an arithmetic mean, for which its step (29) does not hold; we follow Eq. 6.
Eq. 15 in the main text writes the same gradient as ``C (1/N) rho (A + L / R)``, i.e. the
coupling term multiplied by ``rho / R``; autograd confirms Eq. 34, not Eq. 15 (the two agree
only where ``r = R``; tests/objectives/test_echo.py pins this). When R is clipped, C is a
constant and the coupling term vanishes: ``dJ / d logp = C (1/N) A r mask``.

Batch-ratio scope. ``log_ratio_sum=None`` ("micro_batch"): R is formed over this micro-batch.
"global": pass the detached totals of ``sum(log_r)`` and ``sum(mask)`` over every process; then

    log R = (local_sum + sg(log_ratio_sum - local_sum)) / token_count      (SPEC section 2)

so R's value is the global one while each process keeps its own tokens in the graph. On its own
this does NOT make the sum of the processes' gradients equal the gradient of the global
objective: process k's graph only carries the coupling ``d loss / d log R`` of its own tokens,
so the cross-process part of the ``L`` term of Eq. 34 is lost (each process gets ``L_k``, the
share of its own tokens, instead of ``L``). To make it exact, pass ``coupling_sum``: the
all-reduced sum of :func:`echo_batch_ratio_coupling` (a second all-reduce of one scalar). The
missing part ``(coupling_sum - local coupling) * d log R`` is then added as a zero-valued term
spread over the local valid tokens. Exact when the trainer aggregates ``sum(per_token_loss *
mask) / c`` with one constant ``c`` on every process ("dapo", ECHO's default) and applies no
further per-token factor (entropy mask, off-policy mask, vLLM IS ratio);
tests/distributed/test_echo_global_scope.py checks it with 2 processes.

Numerics. Everything is in log space (log R, log C, log rho). log rho is capped at
``MAX_LOG_RHO = 60`` before ``exp`` (rho <= 1.1e26): with log-ratios in [-50, 50] the product
``r * C`` can reach e^100, which is inf in float32 and would make the loss inf and its gradient
NaN. The cap only acts where the exact ratio exceeds 1e26 (gradient 0 there, like a clip).
Half/bfloat16 inputs are computed in float32; float64 stays float64. Positions with
``mask == 0`` get loss 0 and no gradient.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .common import (
    ObjectiveOutput,
    as_token_advantages,
    check_positive,
    check_token_inputs,
    compute_dtype,
    nan_if_empty,
)

MAX_LOG_RHO = 60.0  # cap on log(rho) before exp: finite float32 loss and gradient (see module doc)








def _batch_log_bounds(batch_epsilon_low: float, batch_epsilon_high: float) -> tuple[float, float]:
    """log(1 - eps_b_low), log(1 + eps_b_high); eps_b_low >= 1 means no lower bound (R > 0)."""
    low = math.log1p(-batch_epsilon_low) if batch_epsilon_low < 1 else -math.inf
    return low, math.log1p(batch_epsilon_high)






def _surrogate(
    log_r: Tensor,
    log_ratio: Tensor,
    advantages: Tensor,
    valid: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    batch_bounds: tuple[float, float],
    token_clip: bool,
) -> tuple[Tensor, Tensor]:
    """Per-token ECHO loss (Eq. 7-11) given the token log-ratios and log R. Returns (loss, rho)."""
    log_ratio_bar = log_ratio.clamp(min=batch_bounds[0], max=batch_bounds[1])  # () log R_bar, Eq. 7
    log_c = log_ratio_bar - log_ratio.detach()  # () log C = log R_bar - sg(log R), Eq. 8
    log_rho = (log_r + log_c).clamp(max=MAX_LOG_RHO)  # (B, T) overflow guard, see module doc
    rho = torch.exp(log_rho)  # (B, T) effective token ratio, Eq. 10
    if token_clip:
        clipped = rho.clamp(min=1 - epsilon_low, max=1 + epsilon_high)  # (B, T)
        loss = -torch.min(rho * advantages, clipped * advantages)  # (B, T) Eq. 11
    else:
        loss = -rho * advantages  # (B, T) batch clip only
    return torch.where(valid, loss, torch.zeros_like(loss)), rho  # (B, T), (B, T)


class _Prepared:
    """Upcast inputs, token log-ratios and log R (with the scope's stop-gradients)."""

    def __init__(
        self,
        per_token_logps: Tensor,
        old_per_token_logps: Tensor,
        advantages: Tensor,
        mask: Tensor,
        log_ratio_sum: Tensor | float | None,
        token_count: Tensor | float | None,
    ) -> None:
        check_token_inputs(per_token_logps, old_per_token_logps, advantages, mask)
        if (log_ratio_sum is None) != (token_count is None):
            raise ValueError("log_ratio_sum and token_count must be given together (global scope) or both None")
        dtype = compute_dtype(per_token_logps)
        self.valid = mask.bool()  # (B, T)
        logp = per_token_logps.to(dtype)  # (B, T)
        old = old_per_token_logps.to(dtype).detach()  # (B, T)
        # where (not * mask): padding log-probs may be non-finite and must not leak NaN
        self.log_r = torch.where(self.valid, logp - old, torch.zeros_like(logp))  # (B, T)
        self.advantages = as_token_advantages(advantages.to(dtype).detach())  # (B, 1) or (B, T)
        self.num_valid = self.valid.sum()  # () local valid tokens
        local_sum = self.log_r.sum()  # () keeps the graph to the local tokens
        if log_ratio_sum is None:
            self.global_scope = False
            self.count = self.num_valid.to(dtype)  # ()
            total = local_sum  # ()
        else:
            self.global_scope = True
            self.count = torch.as_tensor(token_count, dtype=dtype, device=logp.device).detach().reshape(())
            global_sum = torch.as_tensor(log_ratio_sum, dtype=dtype, device=logp.device).detach().reshape(())
            total = local_sum + (global_sum - local_sum.detach())  # () value global, grad local
        self.log_ratio = total / self.count.clamp(min=1.0)  # () log R, Eq. 6


def _surrogate_kwargs(epsilon_low: float, epsilon_high: float, batch_epsilon_low: float, batch_epsilon_high: float,
                      token_clip: bool) -> dict:
    """Validated keyword arguments of `_surrogate` (shared by the loss and the coupling)."""
    check_positive(
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        batch_epsilon_low=batch_epsilon_low,
        batch_epsilon_high=batch_epsilon_high,
    )
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
        loss, _ = _surrogate(prep.log_r.detach(), leaf, prep.advantages, prep.valid, **surrogate_kwargs)
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
) -> Tensor:
    """This process's coupling ``sum_{i,t} mask * d loss_{i,t} / d log R`` (0-dim, detached).

    For the exact "global" scope: all-reduce (sum) this over processes and pass the total to
    :func:`echo_loss` as ``coupling_sum``, with the same arguments. Zero when R is clipped.
    """
    kwargs = _surrogate_kwargs(epsilon_low, epsilon_high, batch_epsilon_low, batch_epsilon_high, token_clip)
    prep = _Prepared(per_token_logps, old_per_token_logps, advantages, mask, log_ratio_sum, token_count)
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
) -> ObjectiveOutput:
    """ECHO per-token loss (Eq. 6-11), see the module docstring for equations and decisions.

    Args:
        per_token_logps: (B, T) log pi_theta of the sampled tokens (with gradient).
        old_per_token_logps: (B, T) log pi_old (behaviour policy), treated as constant.
        advantages: (B,) or (B, T) advantages A.
        mask: (B, T) 0/1 completion mask.
        epsilon_low, epsilon_high: token clip, ``clip(rho, 1 - eps_low, 1 + eps_high)``.
        batch_epsilon_low, batch_epsilon_high: batch clip of R, Eq. 7.
        token_clip: False gives ``loss = -rho * A`` (batch clip only).
        log_ratio_sum, token_count: detached global totals of ``sum(log_r)`` and ``sum(mask)``
            over all processes ("global" scope); None for the "micro_batch" scope.
        coupling_sum: all-reduced :func:`echo_batch_ratio_coupling`; makes the global scope's
            summed gradient exact (requires log_ratio_sum/token_count).

    Returns:
        ObjectiveOutput with per_token_loss (B, T) (0 where mask is 0) and metrics
        "echo/batch_ratio" (R), "echo/batch_clipped" (0/1), "clip_ratio/low|high|region"
        (token clip relative to rho; 0 when token_clip=False). NaN where undefined.
    """
    kwargs = _surrogate_kwargs(epsilon_low, epsilon_high, batch_epsilon_low, batch_epsilon_high, token_clip)
    prep = _Prepared(per_token_logps, old_per_token_logps, advantages, mask, log_ratio_sum, token_count)
    if coupling_sum is not None and not prep.global_scope:
        raise ValueError("coupling_sum is only meaningful with log_ratio_sum and token_count (global scope)")
    loss, rho = _surrogate(prep.log_r, prep.log_ratio, prep.advantages, prep.valid, **kwargs)  # (B, T)

    if coupling_sum is not None and prep.log_ratio.requires_grad:
        # Supply the other processes' d loss / d log R through this process's log R graph; the
        # term's value is exactly 0 (x - sg(x)), only its gradient counts. See module doc.
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
