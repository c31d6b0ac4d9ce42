"""A registered advantage estimator with its knobs' defaults, and the estimator contract (`trl_groupopt.testing`)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

import torch
from torch import Tensor
from trl.trainer.utils import nanstd

from ..core.estimators import ESTIMATORS, EstimatorInputs
from ..methods.registry import load_estimators
from .host_sync import HostSyncError, no_host_sync
from .inputs import FLOAT32_RTOL, GROUP_SIZE, SEEDS, mismatch, reward_case, run_properties


def trl_group_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """(B,) TRL's advantages of (B,) weighted rewards (NaN: unscorable): group-centred, divided by the group's
    ``std + 1e-4``, 0 on unscorable rows."""
    # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): `scale_rewards="group"`, sum_then_normalize
    grouped = rewards.view(-1, group_size)  # (K, G)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    advantages = ((grouped - mean) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)).flatten()  # (B,)
    return torch.where(torch.isnan(rewards), torch.zeros_like(advantages), advantages)


def estimator_knob_defaults(estimator: Any) -> dict[str, Any]:
    """The defaults of the config fields that `estimator` reads (its `config_fields`)."""
    defaults = {}
    for name, _, spec in estimator.config_fields:
        factory = getattr(spec, "default_factory", MISSING)
        defaults[name] = spec.default if factory is MISSING else factory()
    return {knob: defaults[knob] for knob in estimator.knobs}


@dataclass(frozen=True)
class BoundEstimator:
    """A registered estimator with its knobs' defaults: ``advantages(rewards, mask)`` as the trainer feeds it."""

    estimator: Any
    knobs: dict[str, Any]

    def advantages(self, rewards: Tensor, mask: Tensor) -> Tensor:
        g = torch.Generator().manual_seed(7)
        energy = torch.rand(mask.shape, generator=g) * 2 * mask  # (B, T) 0 on padding, as the trainer's
        inputs = EstimatorInputs(mask=mask, trl_advantages=trl_group_advantages(rewards, GROUP_SIZE), rewards=rewards,
                                 group_size=GROUP_SIZE, energy=energy)  # fmt: skip
        return self.estimator.estimate(inputs, **self.knobs).advantages.detach()


def _constant_group(bound: BoundEstimator) -> list[str]:
    failures = []
    for seed in SEEDS:
        rewards, mask = reward_case(seed)
        rewards[GROUP_SIZE : 2 * GROUP_SIZE] = 0.75  # group 1: all equal
        advantages = bound.advantages(rewards, mask)[GROUP_SIZE : 2 * GROUP_SIZE]
        if (advantages != 0).any():
            failures.append(
                f"reward seed {seed}, group 1 all 0.75: advantages up to {float(advantages.abs().max()):.3g}"
            )
    return failures


def _reward_shift(bound: BoundEstimator) -> list[str]:
    failures = []
    for seed in SEEDS:
        rewards, mask = reward_case(seed)
        shifted = rewards.clone()
        shifted[:GROUP_SIZE] += 10.0  # group 0 only
        got, want = bound.advantages(shifted, mask), bound.advantages(rewards, mask)
        if (problem := mismatch(got, want, FLOAT32_RTOL)) is not None:
            failures.append(f"reward seed {seed}, +10 on every reward of group 0: the advantages are {problem}")
    return failures


def _finite_rewards(bound: BoundEstimator) -> list[str]:
    rewards, mask = reward_case(0)
    rewards[:GROUP_SIZE] = torch.tensor([1e6, -1e6, 0.0, 1e6])[:GROUP_SIZE]
    rewards[GROUP_SIZE], mask = float("nan"), mask.clone()  # an unscorable row
    mask[GROUP_SIZE + 1] = 0  # an empty row
    advantages = bound.advantages(rewards, mask)
    if not torch.isfinite(advantages).all():
        return [f"rewards +-1e6 and 0 (group 0), NaN (row {GROUP_SIZE}), an empty row: non-finite advantages"]
    return []


def _estimator_no_host_sync(bound: BoundEstimator) -> list[str]:
    rewards, mask = reward_case(0)
    try:
        with no_host_sync():
            bound.advantages(rewards, mask)
    except HostSyncError as error:
        return [f"reward seed 0: the estimator ran {error}, which waits for the device"]
    return []


def check_estimator(name: str) -> None:
    """Check registered advantage estimator `name`, with its knobs' defaults, against the contract (the module
    docstring); raise an `AssertionError` naming each property that fails and the input that shows it."""
    load_estimators()
    estimator = ESTIMATORS.lookup(name)
    properties = [("constant group", _constant_group), ("finite at extremes", _finite_rewards)]
    if getattr(estimator, "shift_invariant", False):
        properties.append(("reward shift", _reward_shift))
    properties.append(("no host sync", _estimator_no_host_sync))
    run_properties(
        f"check_estimator({name!r})", properties, BoundEstimator(estimator, estimator_knob_defaults(estimator))
    )
