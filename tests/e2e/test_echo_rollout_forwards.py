"""ECHO's default "step" scope through TRL's own loop: `trainer.train()` with real generation on a tiny model and TRL's
fused LM head (float32), 2 micro-batches per optimizer step, 2 optimizer steps per rollout (`steps_per_generation=4`),
2 rollouts.

- The loss forwards are counted per optimizer step: one per micro-batch on each rollout's first step (its extra
  no-grad forward is skipped: the buffer gives R's totals), two on its second.
- The same run with the extra forward on every step (as before the shortcut) measures R on the first steps: 1 up to
  float32 rounding, so TRL's old log-probs there are the current policy's (the fact the shortcut rests on), and R on
  the second steps is not 1 (the policy has moved: a shortcut there would be wrong). Both runs log the same R on the
  second steps and train the same parameters (the shortcut changes R's value by rounding only).
"""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest
import torch

from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from trl_groupopt import ECHOConfig, ECHOTrainer

SETTINGS = dict(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2, steps_per_generation=4,
                max_steps=4, max_completion_length=8, learning_rate=1e-2, logging_steps=1)  # fmt: skip
FIRST_STEPS, SECOND_STEPS = (1, 3), (2, 4)  # logged step numbers (global_step after the step)


def _train(tmp_path, tokenizer, name: str) -> dict:
    """Train 4 steps; the loss forwards per optimizer step, the logged R per step, the trained parameters."""
    args = ECHOConfig(**cpu_config_kwargs(tmp_path / name, **SETTINGS))
    assert args.batch_ratio_scope == "step"
    trainer = ECHOTrainer(tiny_model(tokenizer, seed=3), length_reward, args=args, train_dataset=tiny_dataset(16),
                          processing_class=tokenizer)  # fmt: skip
    forward, forwards = trainer._forward_logps_and_entropies, Counter()

    def counted(model, inputs):
        forwards[trainer.state.global_step + 1] += 1  # the step being trained
        return forward(model, inputs)

    trainer._forward_logps_and_entropies = counted
    trainer.train()
    ratios = {e["step"]: e["echo/batch_ratio"] for e in trainer.state.log_history if "echo/batch_ratio" in e}
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return {"forwards": dict(forwards), "ratios": ratios, "params": params}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tokenizer, root = tiny_tokenizer(), tmp_path_factory.mktemp("echo_rollout")
    shortcut = _train(root, tokenizer, "shortcut")
    with mock.patch.object(ECHOTrainer, "_why_step_totals_need_a_forward", lambda self, batches: "forced"):
        forced = _train(root, tokenizer, "forced")
    return shortcut, forced


def test_first_step_after_a_rollout_runs_no_extra_forward(runs):
    shortcut, forced = runs
    micro_batches = SETTINGS["gradient_accumulation_steps"]
    per_micro_batch = {step: n / micro_batches for step, n in sorted(shortcut["forwards"].items())}
    assert per_micro_batch == {1: 1, 2: 2, 3: 1, 4: 2}
    assert forced["forwards"] == {step: 2 * micro_batches for step in (1, 2, 3, 4)}


def test_first_step_shortcut_trains_as_the_forward_does(runs):
    shortcut, forced = runs
    for step in FIRST_STEPS:
        assert shortcut["ratios"][step] == 1.0  # exactly: the shortcut's log R is 0
        assert abs(forced["ratios"][step] - 1.0) < 1e-5  # measured: the behaviour policy is the current one
    for step in SECOND_STEPS:
        assert abs(forced["ratios"][step] - 1.0) > 1e-4  # the policy has moved: the forward is needed here
        assert shortcut["ratios"][step] == pytest.approx(forced["ratios"][step], abs=1e-6)
    diff = max((shortcut["params"][n] - forced["params"][n]).abs().max().item() for n in forced["params"])
    moved = max(
        (forced["params"][n] - p).abs().max().item()
        for n, p in tiny_model(tiny_tokenizer(), seed=3).named_parameters()
        if n in forced["params"]
    )
    assert moved > 1e-2 and diff < 1e-5, (moved, diff)
    assert all(torch.isfinite(p).all() for p in shortcut["params"].values())
