"""Shared pieces of the pure objectives (plain torch, no TRL): output type, checks, masked and group reductions (an
empty mask reduces to 0, never a division by zero), TRL's clipped surrogate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class ObjectiveOutput:
    """What every objective returns: ``per_token_loss`` (B, T), or (B, 1) per sequence, before the trainer's mask and
    `loss_type` aggregation; ``metrics``: detached 0-dim means, or for `clip_ratio/low|high|region` (B, T) / (B, 1) 0/1
    indicators that the trainer reduces over all processes token-weighted, as TRL does."""

    per_token_loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


class ObjectiveFn(Protocol):
    """Every policy objective's signature: (B, T) log-probs, old log-probs and mask, (B,) or (B, T) advantages,
    keyword hyper-parameters bound from the config by the trainer (group-coupled ones also take a `Groups`)."""

    def __call__(
        self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor, /, **kwargs
    ) -> ObjectiveOutput: ...


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """Dtype the objectives compute in: float64 if any input is float64, else float32 (half/bf16 upcast)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def energy_from_log_probs(per_token_logps: Tensor, log_sum_sq_probs: Tensor) -> Tensor:
    """Logit-gradient energy ``e = 1 - 2 p_y + sum_v p_v^2`` (arXiv:2602.07078, Prop. 4.2), (B, T) and detached, from
    TRL's fused LM head's ``log_probs`` and ``log_sum_sq_probs`` (both 0 where the label is -100: energy 0 there)."""
    if per_token_logps.shape != log_sum_sq_probs.shape:
        raise ValueError(
            f"per_token_logps {tuple(per_token_logps.shape)} and log_sum_sq_probs "
            f"{tuple(log_sum_sq_probs.shape)} differ"
        )
    dtype = compute_dtype(per_token_logps, log_sum_sq_probs)
    log_p_y, log_sum_sq = per_token_logps.detach().to(dtype), log_sum_sq_probs.detach().to(dtype)
    return (1.0 - 2.0 * log_p_y.exp() + log_sum_sq.exp()).clamp_min(0.0)  # (B, T); p_y ~ 1 can round below 0


def masked_log_ratio(per_token_logps: Tensor, old_per_token_logps: Tensor, mask: Tensor) -> Tensor:
    """(B, T) ``log r = logp - old`` on valid tokens, exactly 0 elsewhere (`where`, not ``* mask``: padding
    log-probs may be non-finite, and ``nan * 0`` is NaN)."""
    dtype = compute_dtype(per_token_logps)
    diff = per_token_logps.to(dtype) - old_per_token_logps.to(dtype).detach()  # (B, T)
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


def nan_if_empty(value: Tensor, count: Tensor) -> Tensor:
    """Detached 0-dim float32 metric `value`, NaN when `count` is 0 (undefined on this micro-batch)."""
    value = value.detach().float()
    return torch.where(count > 0, value, torch.full_like(value, float("nan")))


def check_positive(*, finite: bool = False, reason: str = "", **values: float) -> None:
    """Raise unless every keyword value is > 0 (NaN too; +inf too with `finite`); `reason` follows "> 0"."""
    for name, value in values.items():
        try:
            positive = value > 0
        except TypeError:  # a string from a config file or a command line ('0.1'): name the option, not '>'
            raise ValueError(f"{name} must be a number > 0{reason}, got {value!r} ({type(value).__name__})") from None
        if not positive:
            raise ValueError(f"{name} must be > 0{reason}, got {value!r}")
        if finite and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number > 0{reason}, got {value!r}")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise unless `value` is one of `choices`, naming them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")


def check_token_inputs(
    per_token_logps: Tensor, old_per_token_logps: Tensor, mask: Tensor, advantages: Tensor | None = None
) -> None:
    """Shape checks shared by the objectives: log-probs, old log-probs and mask (B, T); advantages (B,), (B, 1) or
    (B, T)."""
    shape = per_token_logps.shape
    if per_token_logps.dim() != 2 or old_per_token_logps.shape != shape or mask.shape != shape:
        raise ValueError(
            f"per_token_logps, old_per_token_logps and mask must be one (B, T) shape, got {tuple(shape)}, "
            f"{tuple(old_per_token_logps.shape)}, {tuple(mask.shape)}"
        )
    if advantages is not None and advantages.shape not in (shape[:1], (shape[0], 1), shape):
        raise ValueError(
            f"advantages must be (B,), (B, 1) or (B, T) with (B, T) = {tuple(shape)}, got {tuple(advantages.shape)}"
        )


def clip_indicators(is_low: Tensor, is_high: Tensor) -> dict[str, Tensor]:
    """TRL's `clip_ratio/low|high|region` as detached 0/1 float32 indicators (see `ObjectiveOutput`)."""
    is_low, is_high = is_low.detach().float(), is_high.detach().float()
    return {"clip_ratio/low": is_low, "clip_ratio/high": is_high, "clip_ratio/region": torch.maximum(is_low, is_high)}


def checked_token_weights(weights: Tensor | None, shape: torch.Size, dtype: torch.dtype) -> Tensor | None:
    """The trainer's token weights (the product of TRL's per-token multipliers, `GroupOptTrainer`'s keyword
    `token_weights`), detached in `dtype`: (B, T) or (B, 1), checked against the (B, T) mask `shape`."""
    if weights is None:
        return None
    batch, length = shape
    if weights.dim() != 2 or weights.shape[0] != batch or weights.shape[1] not in (1, length):
        raise ValueError(f"importance_weights must be ({batch}, {length}) or ({batch}, 1), got {tuple(weights.shape)}")
    return weights.detach().to(dtype)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` over positions where `mask` is 1; 0 where the mask is empty."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    mask = mask.expand_as(values)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def as_token_advantages(advantages: Tensor) -> Tensor:
    """(B,) -> (B, 1); (B, 1) and (B, T) unchanged (shapes checked by `check_token_inputs`). Token-level objectives
    broadcast either shape."""
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


@dataclass(frozen=True)
class Groups:
    """The group layout of a (micro-)batch: consecutive runs of ``size`` rows (the trainer's whole groups), reduced as
    ``view(K, G)``, so that no reduction reads the device."""

    num_groups: int  # K
    size: int  # G

    @classmethod
    def contiguous(cls, batch: int, size: int) -> Groups:
        """``batch`` rows in consecutive groups of ``size``."""
        if size < 1 or batch % size:
            raise ValueError(f"a batch of {batch} rows does not hold whole groups of {size}")
        return cls(batch // size, size)

    def covering(self, batch: int) -> Groups:
        """These groups, checked to cover ``batch`` rows."""
        if self.num_groups * self.size != batch:
            raise ValueError(f"the groups cover {self.num_groups * self.size} rows, the batch has {batch}")
        return self

    def reduce(self, values: Tensor, reduce: str) -> Tensor:
        """(K, ...) ``reduce`` ("sum", "mean", "amin", "amax") of (B, ...) ``values`` over each group's rows."""
        grouped = values.reshape(self.num_groups, self.size, *values.shape[1:])  # (K, G, ...)
        return grouped.sum(1) if reduce == "sum" else getattr(grouped, reduce)(1)

    def broadcast(self, per_group: Tensor) -> Tensor:
        """(K, ...) -> (B, ...): each row gets its group's value."""
        return per_group.repeat_interleave(self.size, dim=0)

    def rows(self, values: Tensor, reduce: str) -> Tensor:
        """(B, ...) `reduce` over each row's group, broadcast back to the rows."""
        return self.broadcast(self.reduce(values, reduce))

    def dense(self, values: Tensor) -> Tensor:
        """(B,) -> (K, G): row b at ``[b // G, b % G]``."""
        return values.view(self.num_groups, self.size)


def log_importance_weights(log_ratio: Tensor, mask: Tensor, importance_sampling_level: str) -> Tensor:
    """TRL's log importance weights: the token log-ratios (B, T), or their masked mean per sequence (B, 1) (GSPO)."""
    if importance_sampling_level == "token":
        return log_ratio  # (B, T)
    if importance_sampling_level == "sequence":
        return masked_mean(log_ratio, mask, -1).unsqueeze(-1)  # (B, 1)
    raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")


def clipped_surrogate_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    importance_sampling_level: str = "token",
    delta: float | None = None,
) -> ObjectiveOutput:
    """TRL's clipped surrogate (GRPO/DAPO at token level, GSPO at sequence level): the default objective::

        token:    w_it = pi_theta(o_it) / pi_old(o_it)                         (GRPO, Shao et al. 2024)
        sequence: w_i  = exp( sum_t log w_it / |o_i| )                        (GSPO, Zheng et al. 2025)
        loss      = -min(w A, clip(w, 1 - eps_low, 1 + eps_high) A),   w -> min(w, delta) first if delta is set

    Matches `GRPOTrainer._compute_loss` of TRL 1.16 term by term (tested for parity): (B, T) or, at sequence level,
    (B, 1), with TRL's clip indicators. The epsilons are checked once, with the trainer's arguments (`args_check.py`).
    """
    check_token_inputs(per_token_logps, old_per_token_logps, mask, advantages)
    advantages = as_token_advantages(advantages)  # (B, 1) or (B, T)
    log_weights = log_importance_weights(per_token_logps - old_per_token_logps, mask, importance_sampling_level)
    coef_1 = torch.exp(log_weights)  # (B, T) or (B, 1)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:  # two-sided clip (TRL's `delta`) bounds the unclipped branch too
        coef_1 = torch.clamp(coef_1, max=delta)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)  # (B, T) or (B, 1)
    is_low = (coef_1 < 1 - epsilon_low) & (advantages < 0)
    return ObjectiveOutput(per_token_loss, clip_indicators(is_low, (coef_1 > 1 + epsilon_high) & (advantages > 0)))
