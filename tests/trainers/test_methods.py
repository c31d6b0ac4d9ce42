"""Each method trainer: parity with TRL at its neutral setting and its wiring (the 2-step end-to-end CPU runs are in
tests/e2e/test_method_training.py)."""

from __future__ import annotations

import math

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tests.helpers import (
    clone_model,
    compute_loss_and_grads,
    cpu_config_kwargs,
    inputs_with_policies,
    length_reward,
    random_batch,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from trl_groupopt import (
    CTPOConfig,
    CTPOTrainer,
    DFPOConfig,
    DFPOTrainer,
    ECHOConfig,
    ECHOTrainer,
    OTBConfig,
    OTBTrainer,
)
from trl_groupopt.methods.otb.objective import logit_gradient_energy

TOL = 1e-6


def _build(trainer_cls, config_cls, tmp_path, model, tokenizer, **overrides):
    args = config_cls(**cpu_config_kwargs(tmp_path, per_device_train_batch_size=4, num_generations=2, **overrides))
    trainer = trainer_cls(
        clone_model(model), length_reward, args=args, train_dataset=tiny_dataset(8), processing_class=tokenizer
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=3), tmp_path_factory.mktemp("methods")


def _assert_same(result_a, result_b):
    (loss_a, grads_a, _), (loss_b, grads_b, _) = result_a, result_b
    torch.testing.assert_close(loss_b, loss_a, atol=TOL, rtol=TOL)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=TOL, rtol=TOL, msg=name)


def test_dfpo_none_equals_trl_gspo(tiny):
    """dfpo_transform='none' is TRL's GSPO (sequence-level IS, loss_type grpo): same loss and gradients."""
    tokenizer, model, tmp = tiny
    eps = dict(epsilon=0.05, epsilon_high=0.08)  # wide enough that some sequences are clipped and some are not
    trl = _build(
        GRPOTrainer,
        GRPOConfig,
        tmp / "gspo",
        model,
        tokenizer,
        importance_sampling_level="sequence",
        loss_type="grpo",
        **eps,
    )
    # DFPO defaults to loss_type="dapo" (shared-token cancellation with ragged lengths): ask for GSPO's recipe
    ours = _build(
        DFPOTrainer, DFPOConfig, tmp / "dfpo", model, tokenizer, dfpo_transform="none", loss_type="grpo", **eps
    )
    batch = random_batch(tokenizer, batch_size=6, group_size=2, seed=11, off_policy_scale=0.1, with_ref=False)
    results = [compute_loss_and_grads(t, inputs_with_policies(t, batch)) for t in (trl, ours)]
    _assert_same(*results)
    metrics = results[1][2]
    assert 0 < metrics["clip_ratio/region_mean"][0] < 1  # both branches exercised
    # the batch's advantages are not centred: shrink is 1 over the groups with both signs (NaN if there are none)
    assert metrics["dfpo/shrink"] == [pytest.approx(1.0)] or math.isnan(metrics["dfpo/shrink"][0])
    assert len(metrics["dfpo/cancellation_residual"]) == 1


def test_dfpo_min_replace_differs_and_shrinks(tiny):
    tokenizer, model, tmp = tiny
    ours = _build(DFPOTrainer, DFPOConfig, tmp / "dfpo_mr", model, tokenizer, epsilon=0.5, epsilon_high=0.5)
    batch = random_batch(tokenizer, batch_size=6, group_size=2, seed=12, off_policy_scale=0.3, with_ref=False)
    _, _, metrics = compute_loss_and_grads(ours, inputs_with_policies(ours, batch))
    assert metrics["dfpo/shrink"][0] < 1.0
    assert metrics["dfpo/asym_after"][0] <= metrics["dfpo/asym_before"][0] + 1e-9


def test_ctpo_on_policy_equals_trl_token_grpo(tiny):
    """Ratio 1 everywhere (TRL's on-policy path: no old log-probs): CTPO is token-level GRPO/DAPO."""
    tokenizer, model, tmp = tiny
    trl = _build(GRPOTrainer, GRPOConfig, tmp / "grpo", model, tokenizer, loss_type="dapo")
    ours = _build(CTPOTrainer, CTPOConfig, tmp / "ctpo", model, tokenizer, steps_per_generation=1)
    batch = random_batch(tokenizer, batch_size=6, seed=13, with_ref=False)
    inputs = {k: v for k, v in batch.items() if not k.endswith("_noise")}  # no old_per_token_logps: on-policy
    _assert_same(*[compute_loss_and_grads(t, inputs) for t in (trl, ours)])


def test_echo_loss_value_is_dapo_when_unclipped_but_gradient_is_coupled(tiny):
    """C = 1 in value, so the loss equals DAPO's; its gradient carries the batch-coupling term L (Eq. 34)."""
    tokenizer, model, tmp = tiny
    wide = dict(epsilon=0.9, epsilon_high=10.0)
    trl = _build(GRPOTrainer, GRPOConfig, tmp / "dapo", model, tokenizer, loss_type="dapo", **wide)
    ours = _build(
        ECHOTrainer, ECHOConfig, tmp / "echo", model, tokenizer, batch_epsilon=0.9, steps_per_generation=1, **wide
    )
    batch = random_batch(tokenizer, batch_size=6, seed=14, off_policy_scale=0.05, with_ref=False)
    (loss_a, grads_a, _), (loss_b, grads_b, metrics) = [
        compute_loss_and_grads(t, inputs_with_policies(t, batch)) for t in (trl, ours)
    ]
    torch.testing.assert_close(loss_b, loss_a, atol=TOL, rtol=TOL)
    assert any(not torch.allclose(grads_a[n], grads_b[n], atol=1e-5) for n in grads_a)
    assert metrics["echo/batch_clipped"] == [0.0]


def test_otb_energy_comes_from_the_fused_forward(tiny):
    """The energy OTB reads from TRL's fused head equals 1 - 2p_y + sum p^2 from full logits (temperature 0.7)."""
    tokenizer, model, tmp = tiny
    ours = _build(OTBTrainer, OTBConfig, tmp / "otb", model, tokenizer, temperature=0.7)
    batch = random_batch(tokenizer, batch_size=4, group_size=2, seed=15, with_ref=False)
    inputs = {k: v for k, v in batch.items() if not k.endswith("_noise")}
    inputs["rewards"] = torch.tensor([1.0, 0.0, 0.5, float("nan")])
    loss = ours._compute_loss(ours.model, inputs)
    assert torch.isfinite(loss)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logits = ours.model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
    length = inputs["completion_ids"].shape[1]
    expected = logit_gradient_energy(logits[:, -length:].double(), input_ids[:, -length:], temperature=0.7)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(ours._energy.training_energy[mask].double(), expected[mask], atol=1e-5, rtol=1e-5)
    assert set(ours._metrics["train"]) >= {"otb/energy_mean", "otb/baseline_mean", "otb/adv_abs_mean"}
