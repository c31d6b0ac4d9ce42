"""Rewards so large that float32 cannot centre them per group (issue 46, weak: a reward of 3e38 with ECHO, DFPO or
CTPO trained with loss 0 throughout and exited 0). TRL's group mean of two 3e38 rewards is inf, the advantages NaN,
and its `nan_to_num` turns them into 0: the run learns nothing, silently. `trl_groupopt.data.checks.check_reward_scale`
refuses the generation batch naming the reward function and the scale that works; rewards of any ordinary size pass
unchanged."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import method_config, tiny_dataset, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from trl_groupopt import get_method


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer)


def _reward(value: float):
    def huge_reward(completions, **kwargs):
        return [value if i % 2 else 0.0 for i in range(len(completions))]  # a contrast in every group

    return huge_reward


def _score(method, tmp_path, tiny, reward, **overrides):
    tokenizer, model = tiny
    args = method_config(method, tmp_path, num_generations=4, per_device_train_batch_size=8, steps_per_generation=1,
                         **overrides)  # fmt: skip
    trainer = get_method(method).trainer_class(model, reward, args=args, train_dataset=tiny_dataset(8),
                                               processing_class=tokenizer)  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer._generate_and_score_completions([tiny_dataset(8)[i // 4] for i in range(8)])


@pytest.mark.parametrize("method", tested_methods())
def test_a_reward_too_large_to_centre_is_refused_naming_the_function(method, tmp_path, tiny):
    with pytest.raises(ValueError, match=r"^Reward function 'huge_reward' returned rewards so large .*up to 3e\+38.* "
                       r"every advantage would be 0 .*stays below 4\.6e\+18"):  # fmt: skip
        _score(method, tmp_path, tiny, _reward(3e38))


def test_a_weight_that_makes_the_sum_overflow_is_refused_too(tmp_path, tiny):
    with pytest.raises(ValueError, match="Reward function 'huge_reward' returned rewards so large"):
        _score("echo", tmp_path, tiny, _reward(1e30), reward_weights=[1e9])


def test_large_but_representable_rewards_train(tmp_path, tiny):
    batch = _score("ctpo", tmp_path, tiny, _reward(1e15))
    assert bool(torch.isfinite(batch["advantages"]).all()) and bool((batch["advantages"] != 0).any())
