"""Advantage estimators: which advantages the policy objective receives, chosen by a config's `advantage_estimator`.

OTB (arXiv:2602.07078) changes the *advantages*; ECHO, CTPO, DFPO and GRPO-fix change the *policy objective*. A
trainer picks its objective, its config the estimator from :data:`ESTIMATORS` (as verl picks `adv_estimator` and
`loss_mode` independently). An estimator is a pure function ``estimate(inputs: EstimatorInputs, **knobs) ->
EstimatorOutput`` plus what it needs from the trainer, declared once (the trainer provides exactly that):

- ``needs_raw_rewards``: the weighted, un-normalised rewards (``inputs.rewards``);
- ``needs_whole_groups``: micro-batches of whole groups, consecutive runs of ``inputs.group_size`` rows (the
  trainer's ``num_generations``): group reductions are ``view(K, G)`` and read nothing from the device;
- ``needs_energy``: the rollout policy's logit-gradient energy (``inputs.energy``, from the trainer's fused LM head,
  ``trl_groupopt/trainers/energy.py``); no other estimator pays for it;
- ``knobs``: the config fields it reads (keywords; ``validate`` checks them at config time);
- ``per_token``: (B, T) advantages (objectives on sequence advantages, as DFPO's transforms, refuse them);
- ``trl_advantages``: TRL's own advantages, so TRL's surrogate-replacing loss types (cispo, sapo, vespo) may run.

Shipped: ``"grpo"`` (TRL's group-normalised advantages; the default) and ``"otb"``. A third, e.g. RLOO's
leave-one-out mean, is one :func:`register_estimator` call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from .common import Groups, as_groups, check_choice
from .otb import TOKEN_POSITIONS, otb_advantages

__all__ = [
    "ESTIMATORS",
    "AdvantageEstimator",
    "EstimatorInputs",
    "EstimatorOutput",
    "estimator_of",
    "get_estimator",
    "otb_metrics",
    "otb_zero_tail",
    "register_estimator",
    "unregister_estimator",
]


@dataclass(frozen=True)
class EstimatorInputs:
    """One micro-batch, as an estimator sees it. Fields an estimator does not declare a need for may be None."""

    mask: Tensor  # (B, T) loss mask (completion mask without tool results)
    trl_advantages: Tensor | None = None  # (B,) TRL's group-normalised advantages (`scale_rewards` applied)
    rewards: Tensor | None = None  # (B,) raw weighted rewards, NaN where unscorable (`needs_raw_rewards`)
    group_ids: Tensor | None = None  # (B,) integer group of each row (`needs_whole_groups`)
    group_size: int | None = None  # G: the rows form consecutive groups of G (`needs_whole_groups`); None: group_ids
    energy: Tensor | None = None  # (B, T) energy of the policy that sampled the batch (`needs_energy`)
    importance_weights: Tensor | None = None  # (B, T) vLLM rollout importance weights, when the batch has them
    tool_use: bool = False  # the batch has a tool mask (multi-turn tool use)

    def groups(self) -> Groups:
        """The group layout: consecutive groups of `group_size` (no host sync), else from `group_ids` (one sync)."""
        if self.group_size is not None:
            return Groups.contiguous(self.mask.shape[0], self.group_size, self.mask.device)
        if self.group_ids is None:
            raise ValueError("this estimator needs whole groups: give EstimatorInputs a group_size or group_ids")
        return as_groups(self.group_ids, self.mask.shape[0])


@dataclass(frozen=True)
class EstimatorOutput:
    """Advantages, (B,) or (B, T) and detached, plus metrics: per-token (B, T) tensors that the trainer averages over
    `metrics_mask` on every process (token-weighted, as TRL reduces its own), logged under their names."""

    advantages: Tensor
    metrics: Mapping[str, Tensor] = field(default_factory=dict)
    metrics_mask: Tensor | None = None  # (B, T)


@dataclass(frozen=True)
class AdvantageEstimator:
    """One entry of :data:`ESTIMATORS` (module docstring for the fields)."""

    name: str
    estimate: Callable[..., EstimatorOutput]
    summary: str
    knobs: tuple[str, ...] = ()
    validate: Callable[..., None] | None = None
    needs_raw_rewards: bool = False
    needs_whole_groups: bool = False
    needs_energy: bool = False
    per_token: bool = False
    trl_advantages: bool = False


#: The estimator of a config without an `advantage_estimator` field (TRL's `GRPOConfig`): TRL's own advantages.
DEFAULT_ESTIMATOR = "grpo"
_ESTIMATORS: dict[str, AdvantageEstimator] = {}
#: Read-only view of the registered estimators, name -> :class:`AdvantageEstimator`, in registration order.
ESTIMATORS: Mapping[str, AdvantageEstimator] = MappingProxyType(_ESTIMATORS)


def register_estimator(estimator: AdvantageEstimator) -> AdvantageEstimator:
    """Add `estimator` to :data:`ESTIMATORS` (its knobs must be fields of the configs that select it)."""
    if estimator.name in _ESTIMATORS:
        raise ValueError(f"An advantage estimator named {estimator.name!r} is already registered.")
    _ESTIMATORS[estimator.name] = estimator
    return estimator


def unregister_estimator(name: str) -> None:
    """Remove an estimator (for tests that register a toy one)."""
    get_estimator(name)
    del _ESTIMATORS[name]


def get_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; the error lists the valid names."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"advantage_estimator must be one of {tuple(_ESTIMATORS)}, got {name!r}.") from None


def estimator_of(config: Any) -> AdvantageEstimator:
    """The estimator a config selects: its `advantage_estimator` (an instance or a config class, whose field default
    is read), `"grpo"` for a config without the field (TRL's plain `GRPOConfig`)."""
    return get_estimator(getattr(config, "advantage_estimator", DEFAULT_ESTIMATOR))


# ------------------------------------------------------------------------------------------------ grpo
def _trl_advantages(inputs: EstimatorInputs) -> EstimatorOutput:
    return EstimatorOutput(inputs.trl_advantages)


# ------------------------------------------------------------------------------------------------ otb
def otb_metrics(
    rewards: Tensor, energy: Tensor, advantages: Tensor, mask: Tensor, groups: Groups | Tensor
) -> tuple[dict[str, Tensor], Tensor]:
    """OTB's per-token metrics and the mask to average them over (scored, valid tokens; values there only, so padding's
    non-finite values never reach a sum). `otb/grad_second_moment` is E[A^2 ||grad log p||^2] (energy as the squared
    norm), `otb/grad_second_moment_group_mean_baseline` the same with the group-mean baseline's advantages: the
    mechanism shows as the first below the second."""
    valid = (mask != 0) & (~torch.isnan(rewards)).unsqueeze(1)  # (B, T)
    returns = torch.nan_to_num(rewards).unsqueeze(1)  # (B, 1)
    baseline = returns - advantages  # (B, T) b_t where valid
    groups = as_groups(groups, rewards.shape[0])
    group_adv = returns - groups.rows(returns, "mean")  # (B, 1)
    per_token = {
        "otb/energy_mean": energy,
        "otb/baseline_mean": baseline,
        "otb/adv_abs_mean": advantages.abs(),
        "otb/grad_second_moment": advantages**2 * energy,
        "otb/grad_second_moment_group_mean_baseline": group_adv**2 * energy,
    }  # (B, T) each
    metrics = {name: torch.where(valid, value.detach(), torch.zeros_like(value)) for name, value in per_token.items()}
    return metrics, valid.to(energy.dtype)


def _validate_otb_knobs(*, otb_token_positions: str, otb_handle_zero_tail: bool | None) -> None:
    check_choice("otb_token_positions", otb_token_positions, TOKEN_POSITIONS)
    if otb_handle_zero_tail not in (None, True, False):
        raise ValueError(
            "otb_handle_zero_tail must be True, False or None (None: on for tool-use batches only), "
            f"got {otb_handle_zero_tail!r}."
        )


def otb_zero_tail(otb_handle_zero_tail: bool | None, tool_use: bool) -> bool:
    """`otb_handle_zero_tail` with `None` resolved per batch: on for tool-use batches (verl's defaults for its
    tool-use and single-turn estimators)."""
    return tool_use if otb_handle_zero_tail is None else bool(otb_handle_zero_tail)


def _otb(inputs: EstimatorInputs, *, otb_token_positions: str, otb_handle_zero_tail: bool | None) -> EstimatorOutput:
    """OTB's advantages `G_i - b_t` and metrics."""
    zero_tail = otb_zero_tail(otb_handle_zero_tail, inputs.tool_use)
    groups = inputs.groups()
    advantages = otb_advantages(
        inputs.rewards,
        inputs.energy,
        inputs.mask,
        groups,
        handle_zero_tail=zero_tail,
        token_positions=otb_token_positions,
        importance_weights=inputs.importance_weights,
    )  # (B, T)
    metrics, valid = otb_metrics(inputs.rewards, inputs.energy, advantages, inputs.mask, groups)
    return EstimatorOutput(advantages, metrics, valid)


register_estimator(
    AdvantageEstimator(
        name="grpo",
        estimate=_trl_advantages,
        summary="TRL's group-normalised advantages (G_i - group mean, scaled as `scale_rewards` says)",
        trl_advantages=True,
    )
)
register_estimator(
    AdvantageEstimator(
        name="otb",
        estimate=_otb,
        summary="the optimal token baseline: A_it = G_i - b_t on the raw rewards, b_t weighted by the "
        "logit-gradient energy (arXiv:2602.07078)",
        knobs=("otb_token_positions", "otb_handle_zero_tail"),
        validate=_validate_otb_knobs,
        needs_raw_rewards=True,
        needs_whole_groups=True,
        needs_energy=True,
        per_token=True,
    )
)
