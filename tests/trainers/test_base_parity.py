"""The base trainer with its default objective IS TRL's GRPO/GSPO: same loss and gradients as
`GRPOTrainer._compute_loss` on identical inputs, for every supported loss_type, both importance-sampling levels,
with and without the KL term, and with TRL's shared extras switched on."""

from __future__ import annotations

import itertools

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
from trl_groupopt.trainer.base import GroupOptTrainer

TOL = 1e-6


@pytest.fixture(scope="module")
def trainer_pair(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=1)
    args = GRPOConfig(**cpu_config_kwargs(tmp_path_factory.mktemp("parity"), steps_per_generation=2))
    dataset = tiny_dataset(8)
    trl_trainer = GRPOTrainer(
        clone_model(model), length_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    our_trainer = GroupOptTrainer(
        clone_model(model), length_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    for trainer in (trl_trainer, our_trainer):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    return tokenizer, trl_trainer, our_trainer


def _configure(trainer, **attrs):
    for name, value in attrs.items():
        if name in ("use_bias_correction_kl", "delta", "steps_per_generation"):
            setattr(trainer.args, name, value)
        else:
            setattr(trainer, name, value)


CASES = list(itertools.product(["grpo", "dapo", "bnpo", "dr_grpo"], ["token", "sequence"], [0.0, 0.1]))


@pytest.mark.parametrize("loss_type,level,beta", CASES)
def test_base_equals_trl(trainer_pair, loss_type, level, beta):
    tokenizer, trl_trainer, our_trainer = trainer_pair
    batch = random_batch(tokenizer, batch_size=6, seed=CASES.index((loss_type, level, beta)))
    settings = dict(
        loss_type=loss_type, importance_sampling_level=level, beta=beta, epsilon_low=0.2, epsilon_high=0.28
    )
    results = []
    for trainer in (trl_trainer, our_trainer):
        _configure(trainer, **settings)
        results.append(compute_loss_and_grads(trainer, inputs_with_policies(trainer, batch)))
    (trl_loss, trl_grads, trl_metrics), (our_loss, our_grads, our_metrics) = results
    assert torch.isfinite(trl_loss)
    torch.testing.assert_close(our_loss, trl_loss, atol=TOL, rtol=TOL)
    assert trl_grads.keys() == our_grads.keys() and len(trl_grads) > 0
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], atol=TOL, rtol=TOL, msg=name)
    # TRL's metric names and values are reproduced too.
    for name, values in trl_metrics.items():
        assert name in our_metrics, name
        assert our_metrics[name] == pytest.approx(values, abs=1e-6, nan_ok=True), name


#: The trainer attributes the extras below switch on, at the values every test starts from (and is restored to).
EXTRAS_OFF = dict(
    off_policy_mask_threshold=None,
    top_entropy_quantile=1.0,
    delta=None,
    use_bias_correction_kl=False,
    steps_per_generation=2,
    current_gradient_accumulation_steps=1,
    entropy_coef=0.0,
    _entropy_bonus_enabled=False,
)


@pytest.mark.parametrize(
    "extras",
    [
        dict(off_policy_mask_threshold=0.01),
        dict(top_entropy_quantile=0.5),
        dict(delta=1.1),
        dict(beta=0.05, use_bias_correction_kl=True),
        dict(beta=0.05, use_bias_correction_kl=True, importance_sampling_level="sequence"),
        dict(loss_type="luspo", importance_sampling_level="sequence"),
        dict(loss_type="dapo", steps_per_generation=4, current_gradient_accumulation_steps=2),
        dict(loss_type="grpo", current_gradient_accumulation_steps=3),
        dict(entropy_coef=0.01, _entropy_bonus_enabled=True),
    ],
    ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()),
)
def test_base_equals_trl_with_extras(trainer_pair, extras):
    tokenizer, trl_trainer, our_trainer = trainer_pair
    batch = random_batch(tokenizer, batch_size=6, seed=7)
    settings = dict(
        loss_type="dapo", importance_sampling_level="token", beta=0.0, epsilon_low=0.2, epsilon_high=0.2, **EXTRAS_OFF
    )
    settings.update(extras)
    results = []
    for trainer in (trl_trainer, our_trainer):
        _configure(trainer, **settings)
        results.append(compute_loss_and_grads(trainer, inputs_with_policies(trainer, batch)))
    for trainer in (trl_trainer, our_trainer):  # restore the shared defaults for the other tests
        _configure(trainer, **EXTRAS_OFF)
    (trl_loss, trl_grads, trl_metrics), (our_loss, our_grads, our_metrics) = results
    torch.testing.assert_close(our_loss, trl_loss, atol=TOL, rtol=TOL)
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], atol=TOL, rtol=TOL, msg=name)
    for name, values in trl_metrics.items():
        assert our_metrics[name] == pytest.approx(values, abs=1e-6, nan_ok=True), name
