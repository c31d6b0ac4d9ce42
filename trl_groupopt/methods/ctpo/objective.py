r"""CTPO: cumulative token importance ratio with position-scaled log-space clipping.

Zhang et al., "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective",
arXiv:2605.07331: the authors' length-adaptive policy loss (``_compute_policy_loss_cum_token_la_impl`` in
github.com/horizon-llm/CTPO, ``verl/trainer/ppo/core_algos.py``), defaults from their ``ctpo.sh``. ``mask`` is the loss
mask (0 on padding and tool tokens)::

    l_t      = clamp(logp_t - old_logp_t, -20, 20) * mask_t
    t        = cumsum(mask)                      1-based count of valid tokens
    L_t      = sum_{j<=t} l_j       ("cumprod")  log of the prefix ratio prod_{j<=t} r_j
             = sum_{j<=t} l_j / t   ("geomean")  log of its geometric mean
    log_rho  = min(sg(L_t) + logp_t - sg(logp_t), 10)     prefix stop-gradient
    s_t      = max(t, 1) ** p       p = position_power (0.5 for cumprod, -0.5 for geomean)
    clipped  = clamp(log_rho, -eps_low * s_t, eps_high * s_t)
    loss_t   = max(-A exp(log_rho), -A exp(clipped))
    loss_t   = min(loss_t, -A exp(dual_clip * s_t))   where A < 0             dual clip

Token t's loss sends gradient only to ``logp_t``, weighted by its prefix ratio; on-policy CTPO is TRL's token-level
GRPO. Bias analysis, numerics and deviations from the authors' code: docs/ctpo.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...core.common import (
    ObjectiveOutput,
    as_token_advantages,
    check_token_inputs,
    clip_indicators,
    compute_dtype,
    masked_log_ratio,
    masked_mean,
    nan_if_empty,
)

__all__ = ["DEFAULT_POSITION_POWER", "RATIO_MODES", "ctpo_loss"]

LOG_RATIO_CLAMP = 20.0  # per-token log-ratio clamp before the cumulative sum (authors' code)
MAX_LOG_RHO = 10.0  # cap on the cumulative log ratio (authors' code)
_MAX_DUAL_LOG = 20.0  # > MAX_LOG_RHO: never changes a value, avoids exp overflow (docs/ctpo.md)
# The authors' recommended position power per ratio mode (core_algos.py): the log prefix ratio's spread grows like
# sqrt(t), its per-token mean's shrinks like 1/sqrt(t).
DEFAULT_POSITION_POWER = {"cumprod": 0.5, "geomean": -0.5}
RATIO_MODES = tuple(DEFAULT_POSITION_POWER)  # the authors' cum-token-cumprod-la and cum-token-geomean-la
POSITION_BUCKETS = ((0, 16, "t<=16"), (16, 256, "t<=256"), (256, math.inf, "t>256"))  # (lo, hi] in t


def ctpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float,
    position_power: float,
    ratio_mode: str = "cumprod",
) -> ObjectiveOutput:
    """CTPO per-token loss (the module docstring's symbols; docs/ctpo.md); `CTPOConfig` checks the settings once. Returns the (B, T) loss (0 off the mask), TRL's clip indicators (log_rho beyond its bound),
    "ctpo/dual_clip" (fraction of valid tokens where it binds), "ctpo/abs_cum_log_ratio/t<=16|t<=256|t>256" (mean
    |L_t| over valid tokens per position bucket; NaN when empty).
    """
    check_token_inputs(per_token_logps, old_per_token_logps, mask, advantages)

    dtype = compute_dtype(per_token_logps)
    valid = mask.bool()  # (B, T)
    # where (not * mask): padding log-probs may be non-finite and must not leak NaN
    logp = torch.where(valid, per_token_logps.to(dtype), 0.0)  # (B, T)
    adv = as_token_advantages(advantages.to(dtype).detach()).expand(valid.shape)  # (B, T)
    # the prefix enters the loss as a value only: computed from detached log-probs
    step = masked_log_ratio(per_token_logps.detach(), old_per_token_logps, mask)  # (B, T) 0 off-mask
    step = step.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T) l_t
    position = valid.to(dtype).cumsum(-1)  # (B, T) t: counts valid tokens only
    cum_log_ratio = step.cumsum(-1)  # (B, T) log of the prefix ratio
    if ratio_mode == "geomean":
        cum_log_ratio = cum_log_ratio / position.clamp(min=1.0)  # (B, T) log of its geometric mean
    cum_log_ratio = torch.where(valid, cum_log_ratio, 0.0)  # (B, T) L_t
    scale = position.clamp(min=1.0) ** position_power  # (B, T) s_t

    # value exactly L_t (logp - sg(logp) == 0), gradient d/d logp_t only: the prefix stop-gradient
    log_rho = (cum_log_ratio + (logp - logp.detach())).clamp(max=MAX_LOG_RHO)  # (B, T)
    clipped = torch.clamp(log_rho, min=-epsilon_low * scale, max=epsilon_high * scale)  # (B, T)
    loss = torch.maximum(-adv * torch.exp(log_rho), -adv * torch.exp(clipped))  # (B, T) PPO clip
    dual = -adv * torch.exp((dual_clip * scale).clamp(max=_MAX_DUAL_LOG))  # (B, T) dual-clip bound
    final = torch.where(adv < 0, torch.minimum(loss, dual), loss)  # (B, T)
    final = torch.where(valid, final, 0.0)  # (B, T)

    # metrics: comparisons and the detached prefix, no gradient
    negative = adv < 0  # (B, T)
    is_low = (log_rho < -epsilon_low * scale) & negative & valid  # (B, T)
    is_high = (log_rho > epsilon_high * scale) & (adv > 0) & valid  # (B, T)
    is_dual = (loss > dual) & negative & valid  # (B, T)
    metrics = clip_indicators(is_low, is_high)  # (B, T) each
    metrics["ctpo/dual_clip"] = nan_if_empty(masked_mean(is_dual.to(dtype), valid.to(dtype)), valid.sum())
    abs_cum = cum_log_ratio.abs()  # (B, T)
    for lo, hi, label in POSITION_BUCKETS:
        bucket = (valid & (position > lo) & (position <= hi)).to(dtype)  # (B, T)
        metrics[f"ctpo/abs_cum_log_ratio/{label}"] = nan_if_empty(masked_mean(abs_cum, bucket), bucket.sum())
    return ObjectiveOutput(per_token_loss=final, metrics=metrics)
