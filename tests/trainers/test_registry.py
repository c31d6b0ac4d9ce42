"""The registry of methods (`trl_groupopt.METHODS`): its contract, and a toy method registered inside this test that
reaches the CLI and passes the same generic trainer tests as the built-in methods.

The toy is a complete method in ~30 lines, the parts a real method spreads over its files (docs/adding-a-method.md):
an objective (TRL's clipped surrogate on advantages scaled by a factor), a config subclass with one validated knob, a
trainer subclass that binds the knob to the objective, and one `register_method` call. The generic tests are the
functions of tests/trainers/test_validation.py, tests/hub/test_model_card.py and tests/e2e/ (the 2-step run, the
trained model card) that are parametrised over `METHODS`; they are called here with the toy's name, so the toy goes
through exactly the code the registered methods go through. The two checks that train are marked `slow`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor
from trl import GRPOConfig

from tests.e2e import test_method_training, test_model_card_training
from tests.helpers import (
    compute_loss_and_grads,
    inputs_with_policies,
    method_config,
    method_trainer,
    random_batch,
    tiny_model,
    tiny_tokenizer,
)
from tests.hub import test_model_card
from tests.trainers import test_validation
from trl_groupopt import METHODS, ECHOConfig, ECHOTrainer, cli, get_method, register_method
from trl_groupopt.objectives.common import (
    ObjectiveFn,
    ObjectiveOutput,
    as_token_advantages,
    check_positive,
    clipped_surrogate_loss,
    masked_mean,
)
from trl_groupopt.registry import unregister_method
from trl_groupopt.trainers.base import GroupOptTrainer
from trl_groupopt.trainers.config import TokenSafeConfigMixin

BUILT_IN = {"grpo", "echo", "dfpo", "grpo_fix", "ctpo", "otb"}


# ================================================================================================ the toy method
def toy_loss(per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor, /, *,
             scale: float, epsilon_low: float, epsilon_high: float) -> ObjectiveOutput:  # fmt: skip
    """objectives/toy.py: TRL's clipped surrogate on `scale * A`, plus the headline metric mean |scale * A|."""
    scaled = scale * as_token_advantages(advantages)  # (B, 1) or (B, T)
    out = clipped_surrogate_loss(per_token_logps, old_per_token_logps, scaled, mask, epsilon_low=epsilon_low,
                                 epsilon_high=epsilon_high)  # fmt: skip
    out.metrics["toy/adv_abs_mean"] = masked_mean(scaled.abs().expand_as(mask), mask).detach()
    return out


_: ObjectiveFn = toy_loss  # the objective protocol (checked by a type checker)


@dataclass(repr=False)
class ToyConfig(TokenSafeConfigMixin, GRPOConfig):
    """trainers/toy.py: the config, one knob checked at construction."""

    toy_advantage_scale: float = field(default=2.0, metadata={"help": "Factor on the advantages (> 0)."})

    def __post_init__(self):
        super().__post_init__()
        check_positive(toy_advantage_scale=self.toy_advantage_scale)


class ToyTrainer(GroupOptTrainer):
    """trainers/toy.py: the trainer binds the knob to the objective."""

    config_class = ToyConfig
    _tag_names = ["trl", "toy", "trl-groupopt"]
    _name = "Toy"

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:  # fmt: skip
        return toy_loss(per_token_logps, old_per_token_logps, advantages, mask, scale=self.args.toy_advantage_scale,
                        epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high)  # fmt: skip


@pytest.fixture(scope="module")
def toy():
    """trainers/toy.py's `register_method` call, undone after this module's tests."""
    spec = register_method("toy", config_class=ToyConfig, trainer_class=ToyTrainer, paper="arXiv:2402.03300",
                           headline_metric="toy/adv_abs_mean", summary="GRPO on scaled advantages")  # fmt: skip
    yield spec
    unregister_method("toy")
    assert "toy" not in METHODS


# ================================================================================================ the toy through the CLI
def test_toy_reaches_the_cli(toy, monkeypatch, capsys):
    assert METHODS["toy"] is toy is get_method("toy") and "toy" in cli.METHODS
    _, args, _, demo = cli.parse("toy", [])
    assert type(args) is ToyConfig and args.toy_advantage_scale == 2.0 and demo
    _, args, _, _ = cli.parse("toy", ["--toy_advantage_scale", "3", "--max_steps", "1"])
    assert (args.toy_advantage_scale, args.max_steps) == (3.0, 1)
    with pytest.raises(ValueError, match=r"toy_advantage_scale must be > 0, got -1\.0"):
        cli.parse("toy", ["--toy_advantage_scale", "-1"])

    calls = []
    monkeypatch.setattr(cli, "train", lambda method, argv: calls.append((method, argv)))
    cli.main(["train", "--method", "toy", "--toy_advantage_scale", "3"])  # `trl-groupopt train --method toy ...`
    assert calls == [("toy", ["--toy_advantage_scale", "3"])]
    with pytest.raises(SystemExit):
        cli.main(["train", "--method", "not_a_method"])
    error = capsys.readouterr().err
    assert "invalid choice: 'not_a_method'" in error and "'toy'" in error  # the choices are read from the registry
    assert all(f"'{name}'" in error for name in BUILT_IN)


# ================================================================================================ the toy, generic tests
def _two_steps(tmp_path, monkeypatch):
    tokenizer = tiny_tokenizer()
    test_method_training.test_two_step_training((tokenizer, tiny_model(tokenizer, seed=3), tmp_path), "toy")


def _loss_types(tmp_path, monkeypatch):
    for loss_type in ("cispo", "sapo", "vespo", "not_a_loss"):
        test_validation.test_surrogate_replacing_loss_types_rejected_by_every_trainer(tmp_path, "toy", loss_type)


def _model_card(tmp_path, monkeypatch):
    monkeypatch.setitem(test_model_card.CARD_KNOBS, "toy", "| `toy_advantage_scale` | `2` | (method-specific) |")
    tokenizer = tiny_tokenizer()
    test_model_card.test_model_card_metadata("toy")
    test_model_card_training.test_model_card_renders_method_knobs_rewards_and_citations(
        "toy", tokenizer, tiny_model(tokenizer, seed=5), tmp_path, monkeypatch
    )


GENERIC = {  # the generic trainer tests, each called with the toy's name
    "construct_and_train_two_steps": _two_steps,
    "rejects_surrogate_replacing_loss_types": _loss_types,
    "needs_its_own_config_class": lambda tmp, _: test_validation.test_trainer_needs_its_own_config_class(tmp, "toy"),
    "accepts_partial_groups": lambda tmp, _: test_validation.test_token_level_methods_accept_partial_groups(
        tmp, "toy"
    ),
    "honours_delta": lambda tmp, _: test_validation.test_delta_only_where_the_objective_has_a_two_sided_clip(
        tmp, "toy"
    ),
    "liger_and_unsloth_routing": lambda tmp, _: test_validation.test_liger_and_unsloth_routing_on_the_real_trainers(
        tmp, "toy"
    ),
    "model_card": _model_card,
}
#: the generic checks that run `trainer.train()` (end-to-end tests called for the toy): outside the fast selection
TRAINING_CHECKS = {"construct_and_train_two_steps", "model_card"}


@pytest.mark.parametrize(
    "check", [pytest.param(name, marks=pytest.mark.slow) if name in TRAINING_CHECKS else name for name in GENERIC]
)
def test_toy_passes_the_generic_trainer_tests(toy, check, tmp_path, monkeypatch):
    GENERIC[check](tmp_path, monkeypatch)


def test_toy_objective_is_the_one_trained(toy, tmp_path):
    """The toy's loss is the base's clipped surrogate times the scale (linear in A, scale 2 keeps every clip branch):
    the registered trainer runs the toy's objective, not the default."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3)
    batch = random_batch(tokenizer, batch_size=4, seed=1, with_ref=False)
    losses = {}
    for name in ("grpo", "toy"):
        trainer = method_trainer(name, tmp_path / name, model, tokenizer, loss_type="dapo")
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        losses[name], _, metrics = compute_loss_and_grads(trainer, inputs_with_policies(trainer, batch))
    torch.testing.assert_close(losses["toy"], 2 * losses["grpo"])
    assert metrics["toy/adv_abs_mean"][0] > 0


# ================================================================================================ the registry's contract
def test_built_in_methods_are_registered():
    assert BUILT_IN <= set(METHODS)
    for name, spec in METHODS.items():
        assert spec.name == name and spec.paper and spec.headline_metric
        assert issubclass(spec.config_class, spec.trainer_class.config_class), name


def test_make_config_applies_a_modes_defaults_under_the_callers(tmp_path):
    assert method_config("grpo_fix", tmp_path).dfpo_transform == "symmetric_clip"
    assert method_config("grpo_fix", tmp_path, dfpo_transform="none").dfpo_transform == "none"
    assert method_config("dfpo", tmp_path).dfpo_transform == "min_replace"


def test_duplicate_name_rejected():
    before = METHODS["echo"]
    with pytest.raises(ValueError, match=r"A method named 'echo' is already registered \(by ECHOTrainer\)"):
        register_method("echo", config_class=ToyConfig, trainer_class=ToyTrainer, paper="x", headline_metric="y")
    assert METHODS["echo"] is before


def test_unknown_name_error_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"Unknown method 'nope'; registered methods: ") as error:
        get_method("nope")
    assert all(name in str(error.value) for name in METHODS)
    with pytest.raises(ValueError, match=r"Unknown method 'nope'"):
        cli.parse("nope", [])
    with pytest.raises(ValueError, match=r"Unknown method 'nope'"):
        unregister_method("nope")


def test_config_class_mismatch_rejected():
    with pytest.raises(
        ValueError,
        match=r"ToyTrainer reads a ToyConfig, but method 'toy_mismatch' registers "
        r"config_class=ECHOConfig; register the trainer's own config class",
    ):
        register_method("toy_mismatch", config_class=ECHOConfig, trainer_class=ToyTrainer, paper="x",
                        headline_metric="y")  # fmt: skip
    with pytest.raises(ValueError, match=r"ECHOTrainer reads a ECHOConfig, but .* config_class=ToyConfig"):
        register_method("toy_mismatch", config_class=ToyConfig, trainer_class=ECHOTrainer, paper="x",
                        headline_metric="y")  # fmt: skip
    assert "toy_mismatch" not in METHODS


@pytest.mark.parametrize("name", ["Toy", "toy-method", "", "toy method"])
def test_names_are_cli_values(name):
    with pytest.raises(ValueError, match="lower-case identifiers"):
        register_method(name, config_class=ToyConfig, trainer_class=ToyTrainer, paper="x", headline_metric="y")
    assert name not in METHODS


def test_methods_is_read_only():
    with pytest.raises(TypeError):
        METHODS["toy"] = METHODS["echo"]  # type: ignore[index]
