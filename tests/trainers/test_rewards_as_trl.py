"""Rewards as GRPOTrainer takes them (issue 29): every return value `GRPOTrainer._calculate_rewards` converts is
accepted by our trainers and gives the same reward tensor; an infinite reward fails at once, naming the function and
the completion, for every method; a batch with no reward says None or NaN.

`GRPOTrainer._calculate_rewards` (trl 1.16.0) replaces None by NaN and calls `torch.tensor(..., dtype=float32)` on the
list it iterates, so numpy scalars and bools, numpy arrays and 1-D tensors (bool or float) all work there. The calls
here are the ones the first generation batch makes (training runs: tests/e2e/test_survival.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tests.helpers import cpu_config_kwargs, method_trainer, tiny_dataset
from tests.selection import tested_methods
from trl_groupopt import GroupOptTrainer
from trl_groupopt.data import checks

N = 4
#: name -> what a reward function returns for 4 completions: every form GRPOTrainer converts
FORMS = {
    "python floats and None": [0.5, None, 1.0, -2.0],
    "python bools": [True, False, True, True],
    "numpy bools": [np.bool_(True), np.bool_(False), np.bool_(False), np.bool_(True)],
    "numpy scalars": [np.float32(0.25), np.float64(1.5), np.int64(2), None],
    "numpy array": np.array([0.1, 0.2, np.nan, 0.4]),
    "numpy bool array": np.array([True, False, True, False]),
    "float tensor": torch.tensor([0.5, 1.0, 0.0, 2.0]),
    "bool tensor": torch.tensor([True, True, False, False]),
    "0-d tensors": [torch.tensor(1.0), torch.tensor(0.0), 3, None],
}


def _returning(value):
    def reward(completions, **kwargs):
        return value

    return reward


def _reward_call(trainer, reward_func):
    """`trainer._calculate_rewards` for one batch of 4 completions, as `_generate_and_score_completions` calls it."""
    trainer.reward_funcs = [reward_func]
    trainer.reward_func_names = ["reward"]
    rows = [dict(tiny_dataset(1)[0]) for _ in range(N)]
    prompts = [row["prompt"] for row in rows]
    completions = [[{"role": "assistant", "content": f"answer {i}"}] for i in range(N)]
    return trainer._calculate_rewards(rows, prompts, completions, [[1, 2]] * N)


@pytest.fixture(scope="module")
def trl_and_base(tmp_path_factory, tokenizer, base_model):
    """GRPOTrainer and our base trainer on the same plain GRPOConfig."""
    args = GRPOConfig(**cpu_config_kwargs(tmp_path_factory.mktemp("rewards")))
    kwargs = dict(args=args, train_dataset=tiny_dataset(8), processing_class=tokenizer)
    return (GRPOTrainer(base_model, _returning([0.0] * N), **kwargs),
            GroupOptTrainer(base_model, _returning([0.0] * N), **kwargs))  # fmt: skip


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_grpo_trainer_accepts_is_accepted(trl_and_base, form):
    trl, base = trl_and_base
    value = FORMS[form]
    expected = _reward_call(trl, _returning(value))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # quietly: it runs on every batch
        checks.check_reward_output("reward", value, N)  # the check every trainer wraps reward functions in
    ours = _reward_call(base, checks.checked_reward_func(_returning(value)))
    torch.testing.assert_close(ours, expected, rtol=0, atol=0, equal_nan=True)
    assert ours.shape == (N, 1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.5", r"returned str"),
        ({"a": 1.0}, r"returned dict"),
        (np.array([[1.0], [2.0], [3.0], [4.0]]), r"returned a ndarray of shape \(4, 1\)"),
        (torch.ones(4, 2), r"returned a Tensor of shape \(4, 2\)"),
        ([1.0, "good", 0.0, 1.0], r"returned str 'good' for completion 1 \(a string\)"),
        ([1.0, [0.5], 0.0, 1.0], r"returned list '\[0.5\]' for completion 1 \(of shape \(1,\), not one number\)"),
        ([1.0, object(), 0.0, 1.0], r"returned object .* for completion 1 \(not a number\)"),
    ],
)
def test_what_grpo_trainer_cannot_read_fails_with_the_function_name(value, message):
    with pytest.raises(TypeError, match=rf"Reward function 'f' {message}"):
        checks.check_reward_output("f", value, N)


@pytest.mark.parametrize("name", tested_methods())
@pytest.mark.parametrize("infinite", [float("inf"), -float("inf"), np.float64(1e39)])
def test_an_infinite_reward_fails_naming_the_function_and_the_completion(tmp_path, tokenizer, base_model, name,
                                                                         infinite):  # fmt: skip
    """The same error for every method (the base trainer, TRL's GRPO, included), at the first batch: an infinite
    reward (or one beyond float32, which TRL's conversion makes inf) would otherwise train with NaN or zero
    advantages, silently."""
    trainer = method_trainer(name, tmp_path, base_model, tokenizer)
    value = [0.5, 1.0, infinite, 0.0]
    with pytest.raises(
        ValueError, match=r"Reward function 'reward' returned -?inf for completion 2 of the generation"
    ):
        _reward_call(trainer, checks.checked_reward_func(_returning(value)))


def test_a_batch_without_rewards_says_none_or_nan():
    with pytest.warns(UserWarning, match=r"returned None or NaN for every completion"):
        checks.AllNoneRewardWatch(limit=2).update(torch.full((4, 1), float("nan")), ["nan_reward"], ["solution"])
    watch = checks.AllNoneRewardWatch(limit=None)  # TRL's plain GRPOConfig: warn, never stop
    for _ in range(5):
        with pytest.warns(UserWarning, match=r"nan_reward\) returned None or NaN"):
            watch.update(torch.full((4, 1), float("nan")), ["nan_reward"], ["solution"])
    assert watch.consecutive == 5
