"""Config-to-objective wiring of ECHO and CTPO: every knob reaches the trained loss as the pure function predicts.

For each case a trainer is built from the base config plus one knob change, and `_compute_loss` is driven on an
off-policy batch (`old = logp - log_ratio`, log-ratios shifted so that the clip under test acts). Its loss and
gradient must equal the pure objective called with keyword arguments mapped from the *config* by this test (not read
from the trainer), aggregated as dapo (`sum(loss * mask) / num_items_in_batch`, one process, no accumulation). Each
case also checks that the knob change moves the predicted loss or gradient on that batch, so a trainer that drops,
swaps or hard-codes the knob fails. `batch_ratio_scope` is covered in tests/trainers/test_echo_step_scope.py (it
needs several micro-batches).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import (
    _forward,
    cpu_config_kwargs,
    length_reward,
    random_batch,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from trl_groupopt import CTPOConfig, CTPOTrainer, ECHOConfig, ECHOTrainer
from trl_groupopt.methods.ctpo.objective import ctpo_loss
from trl_groupopt.methods.echo.objective import echo_loss

ATOL, RTOL = 1e-6, 1e-5
SENSITIVE = 1e-4  # the knob must move the loss or a gradient entry by more than this

ECHO_BASE = dict(epsilon=0.2, epsilon_high=0.28, batch_epsilon=0.15, batch_epsilon_high=0.25, token_clip=True)
CTPO_BASE = dict(
    epsilon=0.025, epsilon_high=0.05, ctpo_dual_clip=0.05, ctpo_position_power=0.5, ctpo_ratio_mode="cumprod"
)


def echo_prediction_kwargs(cfg: dict) -> dict:
    return dict(
        epsilon_low=cfg["epsilon"],
        epsilon_high=cfg["epsilon_high"],
        batch_epsilon_low=cfg["batch_epsilon"],
        batch_epsilon_high=cfg["batch_epsilon_high"],
        token_clip=cfg["token_clip"],
    )


def ctpo_prediction_kwargs(cfg: dict) -> dict:
    power = cfg["ctpo_position_power"]
    if power is None:  # the config's documented default per mode
        power = {"cumprod": 0.5, "geomean": -0.5}[cfg["ctpo_ratio_mode"]]
    return dict(
        epsilon_low=cfg["epsilon"],
        epsilon_high=cfg["epsilon_high"],
        dual_clip=cfg["ctpo_dual_clip"],
        position_power=power,
        ratio_mode=cfg["ctpo_ratio_mode"],
    )


METHODS = {
    "echo": (ECHOTrainer, ECHOConfig, ECHO_BASE, echo_loss, echo_prediction_kwargs),
    "ctpo": (CTPOTrainer, CTPOConfig, CTPO_BASE, ctpo_loss, ctpo_prediction_kwargs),
}

# (method, knob change, row shift of the log-ratios): the shift makes the knob's clip act
CASES = [
    ("echo", {}, 0.0),
    ("echo", {"epsilon": 0.05}, 0.0),
    ("echo", {"epsilon_high": 0.05}, 0.0),
    ("echo", {"batch_epsilon": 0.5}, -0.3),  # R ~ e^-0.3 = 0.74: clipped at 0.85, free above 0.5
    ("echo", {"batch_epsilon_high": 0.6}, 0.3),  # R ~ e^0.3 = 1.35: clipped at 1.25, free below 1.6
    ("echo", {"token_clip": False}, 0.0),
    ("ctpo", {}, 0.0),
    ("ctpo", {"epsilon": 0.1}, -0.1),
    ("ctpo", {"epsilon_high": 0.12}, 0.1),
    ("ctpo", {"ctpo_dual_clip": 0.5}, 0.2),
    ("ctpo", {"ctpo_position_power": 0.0}, 0.0),
    ("ctpo", {"ctpo_position_power": 0.25}, 0.0),
    ("ctpo", {"ctpo_ratio_mode": "geomean", "ctpo_position_power": None}, 0.0),  # the authors' p = -0.5
    ("ctpo", {"ctpo_ratio_mode": "geomean", "ctpo_position_power": 0.5}, 0.0),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=5), tmp_path_factory.mktemp("knobs")


def _build(method: str, cfg: dict, tmp_path, model, tokenizer):
    trainer_cls, config_cls, *_ = METHODS[method]
    args = config_cls(
        **cpu_config_kwargs(tmp_path, per_device_train_batch_size=6, num_generations=2, steps_per_generation=2, **cfg)
    )
    trainer = trainer_cls(model, length_reward, args=args, train_dataset=tiny_dataset(8), processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1  # dapo's normaliser: one micro-batch is the whole generation batch
    return trainer


def _inputs(trainer, tokenizer, shift: float) -> dict:
    batch = random_batch(tokenizer, batch_size=6, completion_len=9, seed=21, with_ref=False)
    # holes: a masked token inside a completion (tool output), which CTPO's position count skips
    batch["completion_mask"][-1, 3] = 0
    batch["num_items_in_batch"] = batch["completion_mask"].sum()
    with torch.no_grad():
        logps, _, _ = _forward(trainer, trainer.model, batch)
    inputs = {k: v for k, v in batch.items() if not k.endswith("_noise")}
    inputs["old_per_token_logps"] = (logps - shift - batch["old_logp_noise"]).detach()  # log r = shift + noise
    return inputs


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _trainer_loss(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), _grads(trainer.model)


def _predicted_loss(trainer, inputs, objective, kwargs):
    trainer.model.zero_grad(set_to_none=True)
    logps, _, _ = _forward(trainer, trainer.model, inputs)
    mask = inputs["completion_mask"]
    out = objective(logps, inputs["old_per_token_logps"], inputs["advantages"], mask, **kwargs)
    loss = (out.per_token_loss * mask).sum() / inputs["num_items_in_batch"]
    loss.backward()
    return loss.detach(), _grads(trainer.model)


def _difference(a, b) -> float:
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    return max([(loss_a - loss_b).abs().item()] + [(grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a])


@pytest.mark.parametrize("method,change,shift", CASES, ids=[f"{m}-{c or 'base'}" for m, c, _ in CASES])
def test_knob_reaches_the_trained_loss(tiny, method, change, shift):
    tokenizer, model, tmp = tiny
    _, _, base, objective, to_kwargs = METHODS[method]
    cfg = {**base, **change}
    trainer = _build(method, cfg, tmp / method, model, tokenizer)
    inputs = _inputs(trainer, tokenizer, shift)

    loss, grads = _trainer_loss(trainer, inputs)
    predicted = _predicted_loss(trainer, inputs, objective, to_kwargs(cfg))
    torch.testing.assert_close(loss, predicted[0], atol=ATOL, rtol=RTOL)
    assert grads.keys() == predicted[1].keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], predicted[1][name], atol=ATOL, rtol=RTOL, msg=name)

    if change:  # the knob matters on this batch: the base setting predicts something else
        at_base = _predicted_loss(trainer, inputs, objective, to_kwargs(base))
        assert _difference(predicted, at_base) > SENSITIVE, f"{change} does not act on this batch"
