"""The non-finite guard without training (`trl_groupopt/trainer/guard.py`; the diverging runs:
tests/e2e/test_survival.py): saving weights that hold NaN or inf raises before a file is written, a NaN loss or
gradient norm stops with the step and the causes, and the setting reads as on for TRL's plain `GRPOConfig`."""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig

from tests.helpers import (
    cpu_config_kwargs,
    inputs_with_policies,
    method_config,
    method_trainer,
    random_batch,
    tiny_dataset,
)
from tests.selection import tested_methods
from trl_groupopt import GroupOptTrainer
from trl_groupopt.trainer.guard import NonFiniteError, guard_enabled, nonfinite_weights


@pytest.mark.parametrize("name", tested_methods())
def test_the_guard_is_on_by_default(tmp_path, name):
    assert guard_enabled(method_config(name, tmp_path)) is True


def test_a_plain_grpo_config_is_guarded(tmp_path):
    assert not hasattr(GRPOConfig(**cpu_config_kwargs(tmp_path)), "nonfinite_guard")
    assert guard_enabled(GRPOConfig(**cpu_config_kwargs(tmp_path))) is True
    assert guard_enabled(method_config("echo", tmp_path, nonfinite_guard=False)) is False


def test_nonfinite_weights_names_the_tensors():
    tensors = {"a": torch.ones(3), "b": torch.tensor([1.0, float("nan")]), "c": torch.tensor([float("-inf")]),
               "steps": torch.tensor([3]), "empty": torch.empty(0)}  # fmt: skip
    assert nonfinite_weights(tensors.items()) == ["b", "c"]
    assert nonfinite_weights([]) == []


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_saving_nonfinite_weights_raises_before_writing(tmp_path, tokenizer, base_model, value):
    trainer = method_trainer("otb", tmp_path / "run", base_model, tokenizer)
    out = tmp_path / "saved"
    with torch.no_grad():
        original = trainer.model.model.norm.weight.clone()
        trainer.model.model.norm.weight[0] = value
    try:
        with pytest.raises(NonFiniteError, match=r"Refusing to save weights that hold NaN or inf .*model.norm.weight"):
            trainer.save_model(str(out))
        assert not out.exists() or not any(out.iterdir())
        trainer.args.nonfinite_guard = False  # the option turns it off
        trainer.save_model(str(out))
        assert (out / "model.safetensors").is_file()
    finally:
        with torch.no_grad():
            trainer.model.model.norm.weight.copy_(original)


def test_a_nonfinite_loss_or_gradient_norm_stops_naming_the_step(tmp_path, tokenizer, base_model):
    trainer = GroupOptTrainer(base_model, lambda completions, **kw: [0.0] * len(completions),
                              args=GRPOConfig(**cpu_config_kwargs(tmp_path, learning_rate=3e-3)),
                              train_dataset=tiny_dataset(8), processing_class=tokenizer)  # fmt: skip
    trainer.state.global_step = 6
    for metric, value in (("gradient norm", float("nan")), ("gradient norm", float("inf"))):
        with pytest.raises(NonFiniteError) as stopped:
            trainer._get_grad_norm(trainer.model, grad_norm=torch.tensor(value))
        message = str(stopped.value)
        assert message.startswith(f"Training diverged at step 7: the {metric} is {value}")
        assert "learning_rate=0.003" in message and "rewards on a large scale" in message
        assert "No checkpoint was saved before it." in message
    assert trainer._get_grad_norm(trainer.model, grad_norm=torch.tensor(2.5)) == torch.tensor(2.5)

    inputs = inputs_with_policies(trainer, random_batch(tokenizer))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    assert torch.isfinite(trainer.compute_loss(trainer.model, inputs))
    inputs["advantages"] = inputs["advantages"].clone()
    inputs["advantages"][1] = float("nan")  # a NaN loss, before any backward pass
    with pytest.raises(NonFiniteError, match=r"at step 7: the loss of a micro-batch is nan"):
        trainer.compute_loss(trainer.model, inputs)
    trainer.model.eval()  # evaluation is not guarded (nothing is applied)
    assert torch.isnan(trainer.compute_loss(trainer.model, inputs))
