"""Advantage estimators: which advantages the policy objective receives, chosen by a config's `advantage_estimator`
(as verl picks `adv_estimator` and `loss_mode` independently): a pure ``estimate(inputs: EstimatorInputs, **knobs) ->
EstimatorOutput`` plus what it needs from the trainer. Shipped: ``"grpo"`` (TRL's, the default); a method that is an
estimator defines its own in its folder and names it in its spec (``MethodSpec.estimator``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .common import Groups
from .registry import Registry


@dataclass(frozen=True)
class EstimatorInputs:
    """One micro-batch, as an estimator sees it. Fields an estimator does not declare a need for may be None."""

    mask: Tensor  # (B, T) loss mask (completion mask without tool results)
    trl_advantages: Tensor | None = None  # (B,) TRL's group-normalised advantages (`scale_rewards` applied)
    rewards: Tensor | None = None  # (B,) raw weighted rewards, NaN where unscorable (`needs_raw_rewards`)
    group_size: int | None = None  # G: the rows form consecutive groups of G (`needs_whole_groups`)
    energy: Tensor | None = None  # (B, T) energy of the policy that sampled the batch (`needs_energy`)
    importance_weights: Tensor | None = None  # (B, T) vLLM rollout importance weights, when the batch has them
    tool_use: bool = False  # the batch has a tool mask (multi-turn tool use)

    def groups(self) -> Groups:
        """The group layout: consecutive groups of `group_size` (no host sync)."""
        if self.group_size is None:
            raise ValueError("this estimator needs whole groups: give EstimatorInputs a group_size")
        return Groups.contiguous(self.mask.shape[0], self.group_size)


@dataclass(frozen=True)
class EstimatorOutput:
    """Advantages, (B,) or (B, T) and detached, plus metrics: per-token (B, T) tensors that the trainer averages over
    `metrics_mask` on every process (token-weighted, as TRL reduces its own), logged under their names."""

    advantages: Tensor
    metrics: Mapping[str, Tensor] = field(default_factory=dict)
    metrics_mask: Tensor | None = None  # (B, T)


@dataclass(frozen=True)
class AdvantageEstimator:
    """One entry of :data:`ESTIMATORS`: the function, and what it needs from the trainer (which provides exactly that)."""

    name: str
    estimate: Callable[..., EstimatorOutput]
    summary: str
    knobs: tuple[str, ...] = ()  # the config fields it reads (keywords), checked by `validate` at config time
    validate: Callable[..., None] | None = None
    needs_raw_rewards: bool = False  # the weighted, un-normalised rewards (`inputs.rewards`)
    # micro-batches of whole groups, consecutive runs of `inputs.group_size` rows: reductions read nothing from device
    needs_whole_groups: bool = False
    needs_energy: bool = False  # the rollout logit-gradient energy (`trainer/energy.py`); no other pays it
    per_token: bool = False  # (B, T) advantages (objectives defined on one advantage per sequence refuse them)
    trl_advantages: bool = False  # TRL's own: TRL's surrogate-replacing loss types (cispo, sapo, vespo) may run
    #: Adding a constant to every reward of a group leaves its advantages unchanged (checked by the contract,
    #: `trl_groupopt.testing.check_estimator`).
    shift_invariant: bool = False
    #: The knobs' config fields, `(name, type, dataclasses.field(...))` as `make_dataclass` takes them: every method
    #: config gets them (`trl_groupopt/trainer/config.py`).
    config_fields: tuple[tuple[str, Any, Any], ...] = ()


#: The estimator of a config without an `advantage_estimator` field (TRL's `GRPOConfig`): TRL's own advantages.
DEFAULT_ESTIMATOR = "grpo"
#: The registered estimators, name -> :class:`AdvantageEstimator`, in registration order.
ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", "advantage_estimator must be one of {choices}, got {name!r}."
)


def register_estimator(estimator: AdvantageEstimator) -> AdvantageEstimator:
    """Add `estimator` to :data:`ESTIMATORS` (its knobs must be fields of the configs that select it)."""
    return ESTIMATORS.register(estimator.name, estimator)


def estimator_of(config: Any) -> AdvantageEstimator:
    """The estimator a config selects: its `advantage_estimator` (an instance or a config class, whose field default
    is read), `"grpo"` for a config without the field (TRL's plain `GRPOConfig`)."""
    return ESTIMATORS.lookup(getattr(config, "advantage_estimator", DEFAULT_ESTIMATOR))  # the error lists the names


_GRPO_SUMMARY = "TRL's group-normalised advantages (G_i - group mean, scaled as `scale_rewards` says)"
register_estimator(
    AdvantageEstimator(
        "grpo",
        lambda inputs: EstimatorOutput(inputs.trl_advantages),
        _GRPO_SUMMARY,
        trl_advantages=True,
        shift_invariant=True,
    )
)
