"""The loss path tells the whole story (issue 50): every change to the advantages happens in `compute_advantages`, the
loss path writes TRL's `_metrics` in one place, and TRL's private batch state is read in `trainer/boundary.py` only.

- a method's batch keeps TRL's advantages and marks its equal-reward rows; `compute_advantages` zeroes them (on the
  embedded policy, rewards 0.3 for every completion of a group of 8: TRL's float32 centring leaves ~3e-4 the rule removes);
- read from the source: `_metrics` is written only by `TRLHooks._flush_metrics` / `log_step_metric`, and TRL's
  `_step` / `_buffered_inputs` are read only in `trainer/boundary.py`.
"""

from __future__ import annotations

import ast

import pytest
import torch

from tests.environment import REPO_ROOT
from tests.helpers import cpu_config_kwargs, tiny_dataset
from trl_groupopt import DFPOConfig, DFPOTrainer
from trl_groupopt.data.offline import load_embedded_policy
from trl_groupopt.trainer.batching import EQUAL_REWARDS, zero_equal_reward_rows

PACKAGE = REPO_ROOT / "trl_groupopt"


def test_zero_equal_reward_rows_zeroes_the_marked_rows_only():
    advantages = torch.tensor([0.5, -0.5, 3e-4, 3e-4])
    marked = torch.tensor([False, False, True, True])
    assert torch.equal(zero_equal_reward_rows(advantages, marked), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert zero_equal_reward_rows(advantages, None) is advantages


def test_the_batch_keeps_trls_advantages_and_compute_advantages_applies_the_equal_reward_rule(tmp_path):
    model, tokenizer = load_embedded_policy()
    args = DFPOConfig(**cpu_config_kwargs(tmp_path, per_device_train_batch_size=16, num_generations=8))
    rewards = [0.3] * 8 + [0.0, 1.0] * 4  # group 0: all equal; group 1: a contrast

    def reward(completions, **kwargs):
        return rewards[: len(completions)]

    trainer = DFPOTrainer(model, reward, args=args, train_dataset=tiny_dataset(8), processing_class=tokenizer)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([tiny_dataset(8)[0]] * 8 + [tiny_dataset(8)[1]] * 8)
    assert batch[EQUAL_REWARDS].tolist() == [True] * 8 + [False] * 8
    trl_advantages = batch["advantages"].clone()  # TRL's, untouched by the batch fields
    assert bool((trl_advantages != 0).all()) and float(trl_advantages[:8].abs().max()) < 1e-3  # the residue
    advantages = trainer.compute_advantages(batch, None, batch["completion_mask"])
    assert bool((advantages[:8] == 0).all()) and torch.equal(advantages[8:], trl_advantages[8:])
    assert torch.equal(batch["advantages"], trl_advantages)


def _attribute_uses(name: str) -> list[str]:
    """``path:line`` of every ``<x>.<name>`` in the library's source."""
    uses = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == name:
                uses.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}")
    return uses


def test_only_the_boundary_writes_trls_metrics():
    assert {use.partition(":")[0] for use in _attribute_uses("_metrics")} == {"trainer/boundary.py"}


@pytest.mark.parametrize("name", ["_step", "_buffered_inputs"])
def test_trls_buffered_batch_state_is_read_in_the_boundary_only(name):
    assert {use.partition(":")[0] for use in _attribute_uses(name)} == {"trainer/boundary.py"}
