"""The contract (`trl_groupopt.testing`): every registered method's objective and every registered advantage estimator
passes it, and it fails, naming the property and the input, for objectives and estimators that break the math:

- the "sapo_like" toy of issue 50 (a sigmoid gate on the token ratio, after verl's SAPO loss) passes; with its loss
  sign flipped and its two temperatures swapped it fails the gradient sign (it passed every wiring test); claiming
  to equal GRPO on-policy it fails on the value (its gradient is GRPO's, its value is not);
- GRPO's surrogate with its sign flipped fails the gradient sign and the on-policy equality with GRPO;
- a sequence ratio from an unmasked mean leaks gradient to masked tokens; an `.item()`, a `.tolist()` or a boolean
  index in the objective is a host sync;
- bfloat16 arithmetic on float32 inputs, `exp(5 log r)` and a weight by row position fail the float32 agreement, the
  extremes and the row permutation, each alone;
- an estimator that passes the raw rewards through fails the constant group and the reward shift; one dividing by
  the row length fails the extremes (an empty row); one with an `.item()` fails the host-sync check;
- `python -m trl_groupopt.testing` runs the same, in-process here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor
from trl import GRPOConfig

from trl_groupopt.core.common import ObjectiveOutput, clipped_surrogate_loss, masked_mean
from trl_groupopt.core.estimators import ESTIMATORS, AdvantageEstimator, EstimatorOutput, register_estimator
from trl_groupopt.methods.registry import METHODS, load_estimators, register_method, unregister_method
from trl_groupopt.testing import HostSyncError, check_estimator, check_objective, no_host_sync
from trl_groupopt.trainer.base import GroupOptTrainer

load_estimators()


@pytest.mark.parametrize("name", list(METHODS))
def test_every_registered_objective_passes_the_contract(name):
    check_objective(name)


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        *(("dfpo", {"dfpo_transform": transform}) for transform in ("orth_proj", "orth_proj_qp", "none")),
        ("ctpo", {"ctpo_ratio_mode": "geomean"}),
        ("echo", {"batch_ratio_scope": "micro_batch"}),
        ("echo", {"token_clip": False}),
        ("grpo", {"importance_sampling_level": "sequence", "loss_type": "grpo"}),
        *(("grpo", {"loss_type": loss_type}) for loss_type in ("bnpo", "dr_grpo", "luspo")),
        ("grpo", {"delta": 1.5}),
    ],
)
def test_the_shipped_objectives_pass_under_their_other_settings(name, settings):
    check_objective(name, **settings)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_registered_estimator_passes_the_contract(name):
    check_estimator(name)


def failing_properties(error: pytest.ExceptionInfo) -> list[str]:
    return re.findall(r"^- ([^:]+):", str(error.value), flags=re.MULTILINE)


# ---------------------------------------------------------------------------------------------------------------------
# toy methods, registered for one test


@dataclass
class SapoLikeConfig(GRPOConfig):
    tau_pos: float = 1.0
    tau_neg: float = 1.05


def sapo_like(logps: Tensor, old: Tensor, advantages: Tensor, *, tau_pos: float, tau_neg: float) -> Tensor:
    """A soft gate instead of a clip (verl's SAPO loss): ``-A * 4/tau * sigmoid(tau (r - 1))``, tau by the sign of A;
    at r = 1 its gradient is GRPO's."""
    advantages = advantages.unsqueeze(-1)  # (B, 1)
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    ratio = torch.exp(logps - old.detach())
    return -advantages * torch.sigmoid(tau * (ratio - 1)) * 4 / tau  # (B, T)


class SapoLikeTrainer(GroupOptTrainer):
    config_class = SapoLikeConfig

    def objective(self, logps, old, advantages, mask, inputs):
        return ObjectiveOutput(sapo_like(logps, old, advantages, tau_pos=self.args.tau_pos, tau_neg=self.args.tau_neg))


class SapoLikeFlippedTrainer(SapoLikeTrainer):
    """The toy with its loss sign flipped and its temperatures swapped."""

    def objective(self, logps, old, advantages, mask, inputs):
        return ObjectiveOutput(
            -sapo_like(logps, old, advantages, tau_pos=self.args.tau_neg, tau_neg=self.args.tau_pos)
        )


class FlippedGRPOTrainer(GroupOptTrainer):
    def objective(self, logps, old, advantages, mask, inputs):
        out = super().objective(logps, old, advantages, mask, inputs)
        out.per_token_loss = -out.per_token_loss
        return out


class LeakyTrainer(GroupOptTrainer):
    """A sequence ratio from the mean log-ratio over every position, padding included."""

    def objective(self, logps, old, advantages, mask, inputs):
        log_ratio = (logps - old).mean(-1, keepdim=True)  # (B, 1): should be masked_mean(logps - old, mask, -1)
        return ObjectiveOutput(-advantages.unsqueeze(-1) * torch.exp(log_ratio))


class ItemTrainer(GroupOptTrainer):
    def objective(self, logps, old, advantages, mask, inputs):
        scale = max(advantages.abs().max().item(), 1.0)  # a host sync
        return super().objective(logps, old, advantages / scale, mask, inputs)


class HalfPrecisionTrainer(GroupOptTrainer):
    """GRPO's surrogate, computed in bfloat16 from float32 inputs (float64 ones stay float64)."""

    def objective(self, logps, old, advantages, mask, inputs):
        low = torch.bfloat16 if logps.dtype == torch.float32 else logps.dtype
        out = super().objective(logps.to(low), old.to(low), advantages.to(low), mask, inputs)
        return ObjectiveOutput(out.per_token_loss.to(logps.dtype))


class OverflowingTrainer(GroupOptTrainer):
    """An unclipped ratio raised to the 5th power: exp(5 * 20) overflows float32."""

    def objective(self, logps, old, advantages, mask, inputs):
        return ObjectiveOutput(-advantages.unsqueeze(-1) * torch.exp(5 * (logps - old.detach())) / 5)


class RowWeightedTrainer(GroupOptTrainer):
    """GRPO's surrogate weighted by the row's position in the batch."""

    def objective(self, logps, old, advantages, mask, inputs):
        out = super().objective(logps, old, advantages, mask, inputs)
        rows = torch.arange(1, mask.shape[0] + 1, dtype=out.per_token_loss.dtype).unsqueeze(-1)  # (B, 1)
        return ObjectiveOutput(out.per_token_loss * rows)


def registered(name, trainer_class, config_class=GRPOConfig, **fields):
    spec = register_method(name, config_class=config_class, trainer_class=trainer_class, paper="arXiv:0000.00000",
                           headline_metric="clip_ratio/region_mean", **fields)  # fmt: skip
    return spec


@pytest.fixture
def register():
    names = []

    def add(name, trainer_class, **fields):
        registered(name, trainer_class, **fields)
        names.append(name)
        return name

    yield add
    for name in names:
        unregister_method(name)


def test_sapo_like_passes(register):
    check_objective(register("toy_sapo_like", SapoLikeTrainer, config_class=SapoLikeConfig))


def test_sapo_like_claiming_to_equal_grpo_fails_on_the_value_alone(register):
    """At r = 1 its gradient is GRPO's but its value is ``-2 A / tau``, not ``-A``."""
    name = register("toy_sapo_claim", SapoLikeTrainer, config_class=SapoLikeConfig, on_policy_equals="grpo")
    with pytest.raises(AssertionError, match=r"- equals GRPO on-policy: .*: the loss is off by") as error:
        check_objective(name)
    assert failing_properties(error) == ["equals GRPO on-policy"] and "the gradient" not in str(error.value)


def test_sapo_like_with_its_sign_flipped_and_temperatures_swapped_fails_the_gradient_sign(register):
    name = register("toy_sapo_flipped", SapoLikeFlippedTrainer, config_class=SapoLikeConfig)
    with pytest.raises(AssertionError, match=r"- gradient sign: random seed 0 \(on-policy; row lengths") as error:
        check_objective(name)
    assert failing_properties(error) == ["gradient sign"]


def test_grpo_with_its_sign_flipped_fails_the_sign_and_the_equality_with_grpo(register):
    with pytest.raises(AssertionError, match=r"toy_flipped.* fails 2 of 7 properties") as error:
        check_objective(register("toy_flipped", FlippedGRPOTrainer, on_policy_equals="grpo"))
    assert failing_properties(error) == ["gradient sign", "equals GRPO on-policy"]
    assert "advantage" in str(error.value) and "against TRL's clipped surrogate at ratio 1" in str(error.value)


def test_an_objective_leaking_gradient_through_masked_tokens_fails_the_masked_tokens(register):
    with pytest.raises(AssertionError, match=r"- masked tokens: random seed 0 .*masked tokens get a nonzero") as error:
        check_objective(register("toy_leaky", LeakyTrainer))
    assert failing_properties(error) == ["masked tokens"]


def test_masking_the_leak_passes(register, monkeypatch):
    def masked(self, logps, old, advantages, mask, inputs):
        return ObjectiveOutput(-advantages.unsqueeze(-1) * torch.exp(masked_mean(logps - old, mask, -1).unsqueeze(-1)))

    monkeypatch.setattr(LeakyTrainer, "objective", masked)
    check_objective(register("toy_leak_fixed", LeakyTrainer))


def test_an_objective_with_an_item_inside_fails_no_host_sync(register):
    with pytest.raises(AssertionError, match=r"- no host sync: .*ran Tensor.item\(\)") as error:
        check_objective(register("toy_item", ItemTrainer))
    assert failing_properties(error) == ["no host sync"]


@pytest.mark.parametrize(
    ("trainer_class", "property_name", "shown_by"),
    [
        (HalfPrecisionTrainer, "float32 agrees with float64", "the float32 loss is off by"),
        (OverflowingTrainer, "finite at extremes", "extreme: log-ratios +20, advantages +-1e6"),
        (RowWeightedTrainer, "row permutation", "rows permuted within groups as"),
    ],
)
def test_each_other_property_fails_for_an_objective_that_breaks_it(register, trainer_class, property_name, shown_by):
    with pytest.raises(AssertionError) as error:
        check_objective(register(f"toy_{trainer_class.__name__.lower()}", trainer_class))
    assert failing_properties(error) == [property_name] and shown_by in str(error.value)


@pytest.mark.parametrize(
    ("sync", "named"),
    [
        (lambda x: x.tolist(), "Tensor.tolist()"),
        (lambda x: float(x.sum()), "Tensor.__float__()"),
        (lambda x: x[x > 0], "aten.index[bool index]"),
        (lambda x: x.nonzero(), "aten.nonzero"),
        (lambda x: torch.unique(x), "aten._unique2"),
        (lambda x: x.masked_select(x > 0), "aten.masked_select"),
    ],
)
def test_no_host_sync_refuses_each_kind(sync, named):
    x = torch.randn(3, 4)
    with pytest.raises(HostSyncError, match=re.escape(named)), no_host_sync():
        sync(x)


def test_no_host_sync_lets_device_side_ops_run():
    x = torch.randn(3, 4, requires_grad=True)
    with no_host_sync():
        y = (
            torch.where(x > 0, x, torch.zeros_like(x)).sum()
            + clipped_surrogate_loss(
                x, x.detach(), torch.ones(3), torch.ones(3, 4), epsilon_low=0.2, epsilon_high=0.2
            ).per_token_loss.sum()
        )
    y.backward()


def test_an_estimator_passing_raw_rewards_fails_the_constant_group_and_the_shift():
    estimator = AdvantageEstimator("toy_raw", lambda inputs: EstimatorOutput(inputs.rewards.nan_to_num()), "raw rewards",
                                   needs_raw_rewards=True, shift_invariant=True)  # fmt: skip
    register_estimator(estimator)
    try:
        with pytest.raises(AssertionError, match=r"- constant group: reward seed 0, group 1 all 0.75") as error:
            check_estimator("toy_raw")
    finally:
        ESTIMATORS.unregister("toy_raw")
    assert failing_properties(error) == ["constant group", "reward shift"]


# ---------------------------------------------------------------------------------------------------------------------
# the command line: python -m trl_groupopt.testing


def test_the_command_line_runs_every_registered_objective_and_estimator(capsys):
    from trl_groupopt.testing.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"ok   objective {name}\n" in out for name in METHODS)
    assert all(f"ok   estimator {name}\n" in out for name in ESTIMATORS)
    assert f"{len(METHODS) + len(ESTIMATORS)} of {len(METHODS) + len(ESTIMATORS)} pass the contract" in out


def test_the_command_line_imports_a_users_module_and_fails_naming_the_property(tmp_path, monkeypatch, capsys):
    from trl_groupopt.testing.__main__ import main

    (tmp_path / "my_flipped_method.py").write_text(
        "from tests.trainers.test_contract import FlippedGRPOTrainer, registered\n"
        "registered('toy_cli_flipped', FlippedGRPOTrainer)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["--import", "my_flipped_method", "toy_cli_flipped"]) == 1
    finally:
        unregister_method("toy_cli_flipped")
    out = capsys.readouterr().out
    assert "FAIL objective toy_cli_flipped: check_objective('toy_cli_flipped') fails 1 of 6" in out
    assert "- gradient sign: random seed 0" in out and "0 of 1 pass the contract" in out


def test_the_command_line_refuses_an_unknown_name(capsys):
    from trl_groupopt.testing.__main__ import main

    with pytest.raises(SystemExit):
        main(["nope"])
    assert "not a registered method or estimator: nope" in capsys.readouterr().err


def _per_token_length(inputs):
    return inputs.trl_advantages / inputs.mask.sum(-1)  # an empty row: division by 0


def _synced(inputs):
    return inputs.trl_advantages * (inputs.trl_advantages.abs().max().item() >= 0)  # a host read


@pytest.mark.parametrize(
    ("estimate", "property_name"),
    [(_per_token_length, "finite at extremes"), (_synced, "no host sync")],
)
def test_each_other_estimator_property_fails_for_an_estimator_that_breaks_it(estimate, property_name):
    register_estimator(AdvantageEstimator("toy_estimator", lambda inputs: EstimatorOutput(estimate(inputs)), "toy",
                                          shift_invariant=True))  # fmt: skip
    try:
        with pytest.raises(AssertionError) as error:
            check_estimator("toy_estimator")
    finally:
        ESTIMATORS.unregister("toy_estimator")
    assert failing_properties(error) == [property_name]
