"""Issue 38: a reward function returning tensors on the meta device failed in TRL with `Tensor.item() cannot be called
on meta tensors`, naming no function; the reward check at the door (`trl_groupopt/data/checks.py`) now names it."""

from __future__ import annotations

import pytest
import torch

from trl_groupopt.data.checks import checked_reward_func


def meta_reward(completions, **kwargs):
    return torch.ones(len(completions), device="meta")


def meta_scalars(completions, **kwargs):
    return [torch.tensor(1.0, device="meta") for _ in completions]


@pytest.mark.parametrize("func", [meta_reward, meta_scalars])
def test_a_meta_device_reward_is_one_line_naming_the_function(func):
    with pytest.raises(TypeError) as caught:
        checked_reward_func(func)(prompts=["p", "q"], completions=["a", "b"])
    message = str(caught.value)
    assert f"Reward function {func.__name__!r}" in message and "meta device" in message and "\n" not in message
