"""Numeric options refused at construction, for every registered method's trainer including the baseline with TRL's
plain `GRPOConfig` (issue 38; `trl_groupopt/trainer/args_check.py`): one line naming the option and the fix."""

from __future__ import annotations

import math
import warnings

import pytest

from tests.helpers import length_reward, method_config, tiny_dataset, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from trl_groupopt import get_method

#: option -> (bad value, what the message must say)
BAD = {
    "num_iterations": (0, "num_iterations=0: it must be an integer >= 1"),
    "beta": (-1.0, "beta=-1.0: the KL penalty's weight must be a finite number >= 0"),
    "max_grad_norm": (math.nan, "max_grad_norm=nan: it must be a finite number >= 0"),
    "max_steps": (-5, "max_steps=-5: use a positive number of steps, or -1"),
    "epsilon": (-0.2, "epsilon=-0.2: the clip range must be a finite number >= 0"),
}


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer)


def _build(method, tmp_path, tiny, **overrides):
    tokenizer, model = tiny
    args = method_config(method, tmp_path, num_generations=2, **overrides)
    return get_method(method).trainer_class(model, length_reward, args=args, train_dataset=tiny_dataset(16),
                                            processing_class=tokenizer)  # fmt: skip


@pytest.mark.parametrize("option", list(BAD))
@pytest.mark.parametrize("method", tested_methods())
def test_a_bad_numeric_option_is_refused_at_construction(method, option, tmp_path, tiny):
    value, expected = BAD[option]
    try:
        config = method_config(method, tmp_path, num_generations=2, **{option: value})
    except ValueError as err:  # the method's config refuses it itself: also one line that names the option
        assert option in str(err) and "\n" not in str(err), err
        return
    with pytest.raises(ValueError) as caught:
        get_method(method).trainer_class.validate_args(config)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message


def test_the_baseline_refuses_at_construction_naming_every_bad_option(tmp_path, tiny):
    """The baseline (plain GRPOConfig) built whole: the refusal comes from the constructor, before TRL's."""
    with pytest.raises(ValueError) as caught:
        _build("grpo", tmp_path, tiny, num_iterations=0, beta=-1.0, epsilon=-0.1)
    message = str(caught.value)
    assert (
        message.startswith("GroupOptTrainer: num_iterations=0")
        and "beta=-1.0" in message
        and "epsilon=-0.1" in message
    )


def test_save_steps_inside_a_generation_cycle_warns_at_construction(tmp_path, tiny):
    with pytest.warns(UserWarning, match=r"save_steps=5 saves inside a generation cycle of 4 optimizer steps"):
        _build("echo", tmp_path, tiny, save_strategy="steps", save_steps=5, steps_per_generation=4,
               gradient_accumulation_steps=1, per_device_train_batch_size=4)  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="save_steps=")
        _build("echo", tmp_path, tiny, save_strategy="steps", save_steps=4, steps_per_generation=4,
               gradient_accumulation_steps=1, per_device_train_batch_size=4)  # fmt: skip
