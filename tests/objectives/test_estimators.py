"""Tests for trl_groupopt.core.estimators: the registry of advantage estimators (pure torch).

- "grpo" returns TRL's advantages themselves; "otb" is `otb_advantages` with the configured knobs (its zero tail
  resolved per batch: on for tool use) plus OTB's metrics, whose reference is written here in plain loops.
- Each entry declares what the trainer must give it; the registry rejects duplicates and lists the names on errors.
"""

from __future__ import annotations

import pytest
import torch

from trl_groupopt.core.common import Groups
from trl_groupopt.core.estimators import (
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    AdvantageEstimator,
    EstimatorInputs,
    estimator_of,
    register_estimator,
)
from trl_groupopt.methods.otb.objective import OTB_ESTIMATOR, otb_advantages, otb_zero_tail

if "otb" not in ESTIMATORS:  # as the trainer's configs register it (`load_estimators`), when this file runs alone
    register_estimator(OTB_ESTIMATOR)


def _batch(seed: int = 0, tool_use: bool = False) -> EstimatorInputs:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 5, 2, 4, 4, 1, 6])  # a unique longest member in each group of 4
    mask = (torch.arange(6)[None, :] < lengths[:, None]).double()  # (8, 6)
    return EstimatorInputs(
        mask=mask,
        trl_advantages=torch.randn(8, generator=g, dtype=torch.float64),
        rewards=torch.rand(8, generator=g, dtype=torch.float64),
        group_size=4,
        energy=torch.rand(8, 6, generator=g, dtype=torch.float64) * mask,
        tool_use=tool_use,
    )


def test_registry_holds_the_shipped_estimators_and_their_needs():
    assert list(ESTIMATORS)[:2] == ["grpo", "otb"] and DEFAULT_ESTIMATOR == "grpo"
    grpo, otb = ESTIMATORS["grpo"], ESTIMATORS["otb"]
    assert grpo.trl_advantages and not (grpo.needs_raw_rewards or grpo.needs_whole_groups or grpo.needs_energy)
    assert not grpo.per_token and grpo.knobs == ()
    assert otb.needs_raw_rewards and otb.needs_whole_groups and otb.needs_energy and otb.per_token
    assert not otb.trl_advantages and otb.knobs == ("otb_token_positions", "otb_handle_zero_tail")
    with pytest.raises(ValueError, match=r"advantage_estimator must be one of \('grpo', 'otb'.*got 'gae'"):
        ESTIMATORS.lookup("gae")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator(AdvantageEstimator(name="otb", estimate=lambda inputs: None, summary=""))


def test_estimator_of_reads_the_field_or_defaults_to_trls():
    class WithField:
        advantage_estimator = "otb"

    assert estimator_of(WithField) is ESTIMATORS["otb"] and estimator_of(WithField()) is ESTIMATORS["otb"]
    assert estimator_of(object()) is ESTIMATORS["grpo"]  # e.g. TRL's GRPOConfig


def test_grpo_returns_trls_advantages_themselves():
    inputs = _batch()
    out = ESTIMATORS["grpo"].estimate(inputs)
    assert out.advantages is inputs.trl_advantages and not out.metrics


@pytest.mark.parametrize("tool_use", [False, True])
@pytest.mark.parametrize("zero_tail", [None, True, False])
@pytest.mark.parametrize("positions", ["valid", "absolute"])
def test_otb_is_otb_advantages_with_its_knobs(tool_use, zero_tail, positions):
    inputs = _batch(tool_use=tool_use)
    out = ESTIMATORS["otb"].estimate(inputs, otb_token_positions=positions, otb_handle_zero_tail=zero_tail)
    resolved = tool_use if zero_tail is None else zero_tail
    assert otb_zero_tail(zero_tail, tool_use) is resolved
    expected = otb_advantages(inputs.rewards, inputs.energy, inputs.mask, Groups.contiguous(8, 4),
                              handle_zero_tail=resolved, token_positions=positions)  # fmt: skip
    torch.testing.assert_close(out.advantages, expected, atol=0, rtol=0)
    assert out.advantages.shape == inputs.mask.shape


def test_otb_metrics_against_a_loop_reference():
    """Token-weighted means over the scored tokens: |A|, b_t = G - A, e, A^2 e and (G - group mean)^2 e."""
    inputs = _batch(seed=3)
    rewards = inputs.rewards.clone()
    rewards[5] = float("nan")  # an unscorable row: its tokens leave every metric
    inputs = EstimatorInputs(**{**inputs.__dict__, "rewards": rewards})
    out = ESTIMATORS["otb"].estimate(inputs, otb_token_positions="valid", otb_handle_zero_tail=False)
    sums, count = {}, 0.0
    for i in range(8):
        if rewards[i].isnan():
            continue
        group = [j for j in range(8) if j // 4 == i // 4]
        group_mean = sum(0.0 if rewards[j].isnan() else float(rewards[j]) for j in group) / len(group)
        for t in range(6):
            if inputs.mask[i, t] == 0:
                continue
            a, e, g = float(out.advantages[i, t]), float(inputs.energy[i, t]), float(rewards[i])
            for name, value in (("otb/adv_abs_mean", abs(a)), ("otb/baseline_mean", g - a), ("otb/energy_mean", e),
                                ("otb/grad_second_moment", a * a * e),
                                ("otb/grad_second_moment_group_mean_baseline", (g - group_mean) ** 2 * e)):  # fmt: skip
                sums[name] = sums.get(name, 0.0) + value
            count += 1
    assert set(out.metrics) == set(sums)
    assert float(out.metrics_mask.sum()) == count
    for name, total in sums.items():
        got = float((out.metrics[name] * out.metrics_mask).sum() / out.metrics_mask.sum())
        assert got == pytest.approx(total / count, rel=1e-12, abs=1e-14), name
        assert torch.isfinite(out.metrics[name]).all()


def test_otb_knob_validation_names_the_field():
    validate = ESTIMATORS["otb"].validate
    validate(otb_token_positions="valid", otb_handle_zero_tail=None)
    with pytest.raises(ValueError, match="otb_token_positions must be one of"):
        validate(otb_token_positions="compact", otb_handle_zero_tail=None)
    with pytest.raises(ValueError, match="otb_handle_zero_tail must be True, False or None"):
        validate(otb_token_positions="valid", otb_handle_zero_tail="yes")


def test_otb_advantages_sum_to_zero_over_a_prefix_the_whole_group_shares():
    """Where every member of a group shares the prefix, its energies (and IS weights) are the same for every member,
    so b_t is the group mean of the returns and sum_i A_it = 0 there (up to b_t's 1e-8): a token shared by the whole
    group gets no net gradient from an objective with one coefficient per token across the group (GRPO-fix's
    Corollary H.1, docs/dfpo.md). After the prefix the energies differ and the sum does not vanish."""
    inputs = _batch(seed=5)
    prefix = 2  # every row has >= 2 valid tokens except row 6 (1 token): its group shares 1 position
    energy = inputs.energy.clone()
    for group in (range(0, 4), range(4, 8)):
        energy[list(group), :prefix] = energy[group[0], :prefix]
    inputs = EstimatorInputs(**{**inputs.__dict__, "energy": energy})
    advantages = ESTIMATORS["otb"].estimate(inputs, otb_token_positions="valid", otb_handle_zero_tail=False).advantages
    sums = advantages.view(2, 4, -1).sum(1)  # (K, T) sum over each group's members
    torch.testing.assert_close(sums[0, :prefix], torch.zeros(prefix, dtype=torch.float64), atol=1e-7, rtol=0)
    torch.testing.assert_close(sums[1, :1], torch.zeros(1, dtype=torch.float64), atol=1e-7, rtol=0)
    assert sums[0, prefix:].abs().max() > 1e-2  # energies differ from here on
