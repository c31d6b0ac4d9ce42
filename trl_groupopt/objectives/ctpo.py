r"""CTPO: cumulative token importance ratio with sqrt(t)-scaled log-space clipping (SPEC section 4).

Sources. The paper texts we have (papers 002 and 004) are the abstract and a review: they define
the cumulative token IS ratio ``rho_t = prod_{j<=t} pi_theta(y_j | y_<j) / pi_old(y_j | y_<j)``
and "log-space clip bounds that scale with sqrt(t)", but print no loss formula. The formula
below follows the authors' code as SPEC section 4 says: the ``cum-token-cumprod-la`` policy loss
(``_compute_policy_loss_cum_token_la_impl``) in github horizon-llm/CTPO,
``verl/trainer/ppo/core_algos.py``, with their script's defaults (``ctpo.sh``: eps_low = 0.025,
eps_high = 0.05, eps_c = 0.05, p = 0.5, token-mean aggregation = TRL ``loss_type="dapo"``, no KL).

With ``mask`` the completion mask (0 on padding and on tool/observation tokens):

    l_t      = clamp(logp_t - old_logp_t, -20, 20) * mask_t
    L_t      = sum_{j<=t} l_j                  (0 where mask_t = 0)       cumulative log ratio
    log_rho  = sg(L_t) + logp_t - sg(logp_t)   value: log of the prefix product rho_t;
                                               gradient: rho_t * grad logp_t only (prefix sg)
    log_rho  = min(log_rho, 10)
    t        = cumsum(mask)                    1-based count of valid tokens (tool tokens do not advance it)
    s_t      = max(t, 1) ** p                  p = position_power; 0.5 gives the sqrt(t) scaling
    clipped  = clamp(log_rho, -eps_low * s_t, eps_high * s_t)
    loss_t   = max(-A exp(log_rho), -A exp(clipped))                       PPO min as a max of losses
    loss_t   = min(loss_t, -A exp(eps_c * s_t))   where A < 0              dual clip

The prefix stop-gradient is the point of the method: token t's loss sends gradient only to
``logp_t`` (weighted by the prefix product), none to ``j < t``. Unclipped, ``E_mu[rho_t grad
log pi(y_t | y_<t) A_t] = E_pi[grad log pi(y_t | y_<t) A_t]`` for a per-token advantage that
depends on the prefix y_<=t only (the token-level policy-gradient formulation under which the
abstract states unbiasedness). With one sequence-level advantage, which also depends on the
tokens after t (drawn from mu, not pi), the prefix correction alone is not unbiased off-policy;
the full-sequence ratio is unbiased there (the review's objection; tests/objectives/test_ctpo.py shows
both).

Knobs. ``position_power = 0`` gives a constant log-space window ``[e^-eps_low, e^eps_high]`` and
dual-clip threshold ``e^eps_c``. The authors' non-LA ``cum-token-cumprod`` ablation clips in ratio
space, ``[1 - eps, 1 + eps']`` with dual-clip constant c; it is reproduced exactly with
``position_power=0, epsilon_low=-log(1 - eps), epsilon_high=log(1 + eps'), epsilon_c=log(c)``.
On-policy (old == current) every ratio is 1 and CTPO equals TRL's token-level GRPO surrogate.

Numerics. All in log space; ``log_rho <= 10`` (authors' cap), so T = 32k is finite. Since then
``loss_t <= -A e^10`` for A < 0, the dual-clip exponent is capped at 20 without changing any value
(it avoids ``exp`` overflow and ``0 * inf`` for A = 0 when eps_c * s_t is large). Half/bfloat16
inputs are computed in float32; float64 stays float64. Positions with mask 0 get loss 0 and no
gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import ObjectiveOutput, as_token_advantages, check_token_inputs, compute_dtype, masked_mean, nan_if_empty

LOG_RATIO_CLAMP = 20.0  # per-token log-ratio clamp before the cumulative sum (authors' code)
MAX_LOG_RHO = 10.0  # cap on the cumulative log ratio (authors' code)
_MAX_DUAL_LOG = 20.0  # > MAX_LOG_RHO: never binds, see module doc
POSITION_BUCKETS = ((0, 16, "t<=16"), (16, 256, "t<=256"), (256, None, "t>256"))  # (lo, hi] in t








def ctpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    epsilon_c: float,
    position_power: float,
) -> ObjectiveOutput:
    """CTPO per-token loss, see the module docstring for the equations and their source.

    Args:
        per_token_logps: (B, T) log pi_theta of the sampled tokens (with gradient).
        old_per_token_logps: (B, T) log pi_old (behaviour policy), treated as constant.
        advantages: (B,) or (B, T) advantages A.
        mask: (B, T) 0/1 mask of the tokens the policy generated (tool tokens 0).
        epsilon_low, epsilon_high: log-space clip bases, window ``[-eps_low s_t, eps_high s_t]``.
        epsilon_c: log-space dual-clip base, threshold ``exp(eps_c s_t)`` for A < 0.
        position_power: p in ``s_t = max(t, 1) ** p`` (0.5: sqrt(t); 0: constant window).

    Returns:
        ObjectiveOutput with per_token_loss (B, T) (0 where mask is 0) and metrics
        "clip_ratio/low|high|region" (log_rho beyond its bound with A < 0 / A > 0),
        "ctpo/dual_clip" (fraction of valid tokens where the dual clip binds), and
        "ctpo/abs_cum_log_ratio/t<=16|t<=256|t>256": mean |L_t| over valid tokens with
        t in (0, 16], (16, 256], (256, inf) (disjoint buckets; NaN when a bucket is empty).
    """
    for name, value in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high), ("epsilon_c", epsilon_c)):
        if not value > 0:  # also rejects NaN
            raise ValueError(f"{name} must be > 0, got {value}")
    if not position_power >= 0:
        raise ValueError(f"position_power must be >= 0, got {position_power}")
    check_token_inputs(per_token_logps, old_per_token_logps, advantages, mask)

    dtype = compute_dtype(per_token_logps)
    valid = mask.bool()  # (B, T)
    zeros = torch.zeros(valid.shape, dtype=dtype, device=per_token_logps.device)  # (B, T)
    # where (not * mask): padding log-probs may be non-finite and must not leak NaN
    logp = torch.where(valid, per_token_logps.to(dtype), zeros)  # (B, T)
    old = torch.where(valid, old_per_token_logps.to(dtype).detach(), zeros)  # (B, T)
    adv = as_token_advantages(advantages.to(dtype).detach()).expand(valid.shape)  # (B, T)

    with torch.no_grad():  # the prefix only enters as a value (stop-gradient)
        step = (logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T) l_t, 0 off-mask
        cum_log_ratio = torch.where(valid, step.cumsum(-1), zeros)  # (B, T) L_t
        position = valid.to(dtype).cumsum(-1)  # (B, T) t: counts valid tokens only
        scale = position.clamp(min=1.0) ** position_power  # (B, T) s_t

    # value exactly L_t (logp - sg(logp) == 0), gradient d/d logp_t only: the prefix stop-gradient
    log_rho = (cum_log_ratio + (logp - logp.detach())).clamp(max=MAX_LOG_RHO)  # (B, T)
    clipped = torch.clamp(log_rho, min=-epsilon_low * scale, max=epsilon_high * scale)  # (B, T)
    loss = torch.maximum(-adv * torch.exp(log_rho), -adv * torch.exp(clipped))  # (B, T) PPO clip
    dual = -adv * torch.exp((epsilon_c * scale).clamp(max=_MAX_DUAL_LOG))  # (B, T) dual-clip bound
    negative = adv < 0  # (B, T)
    final = torch.where(negative, torch.minimum(loss, dual), loss)  # (B, T)
    final = torch.where(valid, final, zeros)  # (B, T)

    with torch.no_grad():
        n = valid.sum()
        log_rho_d = log_rho.detach()  # (B, T)
        is_low = (log_rho_d < -epsilon_low * scale) & negative & valid  # (B, T)
        is_high = (log_rho_d > epsilon_high * scale) & (adv > 0) & valid  # (B, T)
        is_dual = (loss.detach() > dual) & negative & valid  # (B, T)
        metrics = {
            # per-token indicators: the trainer reduces them over processes token-weighted, as TRL does
            "clip_ratio/low": is_low.float(),  # (B, T)
            "clip_ratio/high": is_high.float(),  # (B, T)
            "clip_ratio/region": (is_low | is_high).float(),  # (B, T)
            "ctpo/dual_clip": nan_if_empty(masked_mean(is_dual.to(dtype), valid.to(dtype)), n),
        }
        abs_cum = cum_log_ratio.abs()  # (B, T)
        for lo, hi, label in POSITION_BUCKETS:
            in_bucket = valid & (position > lo)  # (B, T)
            if hi is not None:
                in_bucket = in_bucket & (position <= hi)
            bucket = in_bucket.to(dtype)  # (B, T)
            metrics[f"ctpo/abs_cum_log_ratio/{label}"] = nan_if_empty(masked_mean(abs_cum, bucket), bucket.sum())
    return ObjectiveOutput(per_token_loss=final, metrics=metrics)
