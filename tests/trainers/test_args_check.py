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
        _build("echo", tmp_path, tiny, save_strategy="steps", save_steps=5, steps_per_generation=4, max_steps=20,
               gradient_accumulation_steps=1, per_device_train_batch_size=4)  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="save_steps=")
        _build("echo", tmp_path, tiny, save_strategy="steps", save_steps=4, steps_per_generation=4, max_steps=20,
               gradient_accumulation_steps=1, per_device_train_batch_size=4)  # fmt: skip


def test_save_steps_past_max_steps_does_not_warn(tmp_path, tiny):
    """Was: the README's own snippet (max_steps=5, TRL's save_steps=500) warned about resuming mid-cycle, though the
    run saves no checkpoint before its last step (issue 46, friction)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="save_steps=")
        _build("echo", tmp_path, tiny, save_strategy="steps", save_steps=500, steps_per_generation=8, max_steps=5,
               gradient_accumulation_steps=1, per_device_train_batch_size=4)  # fmt: skip


#: issue 46 (broken 7 and 9, weak): option -> [(bad value, extra settings it needs)]; each refused by the trainer's
#: `validate_args` (or already by the method's config), naming the option, before `GRPOTrainer.__init__`.
NAN, INF = math.nan, math.inf
MORE_BAD = {
    "temperature": [0.0, -1.0, NAN, INF],
    "top_p": [0.0, -1.0, NAN, INF],
    "min_p": [-1.0, NAN],
    "repetition_penalty": [0.0, NAN, INF],
    "top_k": [-1],
    "adam_beta1": [-1.0, NAN],
    "adam_beta2": [NAN, 1.5],
    "adam_epsilon": [0.0, NAN, INF],
    "weight_decay": [-1.0],
    "per_device_train_batch_size": [0],
    "scale_rewards": ["groups"],
    "top_entropy_quantile": [-1.0, NAN, 2.0],
    "reward_weights": [[NAN], [INF], [0.0]],
    "save_steps": [0, -1],
    "logging_steps": [-1],
    "num_generations": [0],
    "gradient_accumulation_steps": [0],
    "steps_per_generation": [0],
}
#: TRL's own `GRPOConfig.__post_init__` divides by it first (ZeroDivisionError): for the baseline's plain GRPOConfig,
#: only the command line can refuse it earlier (tests/test_option_checks.py).
TRL_RAISES_FIRST = {("grpo", "num_generations")}


@pytest.mark.parametrize("option,value", [(o, v) for o, values in MORE_BAD.items() for v in values])
@pytest.mark.parametrize("method", tested_methods())
def test_every_generic_option_is_refused_before_the_model_loads(method, option, value, tmp_path):
    if (method, option) in TRL_RAISES_FIRST:
        pytest.skip("TRL's GRPOConfig raises first; the command line refuses it at parse")
    settings = {"num_generations": 2, "save_strategy": "steps" if option == "save_steps" else "no", option: value}
    try:
        config = method_config(method, tmp_path, **settings)
    except ValueError as err:  # the config refuses it itself (a count, before TRL's division): one line naming it
        assert option in str(err) and "\n" not in str(err), err
        return
    with pytest.raises(ValueError) as caught:
        get_method(method).trainer_class.validate_args(config)
    message = str(caught.value)
    assert f" {option}=" in message and "\n" not in message, message


def test_a_model_given_by_name_is_not_loaded(tmp_path, monkeypatch):
    """The Python API: `validate_args` runs before `GRPOTrainer.__init__` loads the model named."""
    import transformers

    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

    def loaded(*args, **kwargs):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(loaded))
    args = method_config("ctpo", tmp_path, num_generations=2, temperature=math.nan, top_entropy_quantile=-1.0)
    with pytest.raises(ValueError, match=r"^CTPOTrainer: temperature=nan: .*; top_entropy_quantile=-1.0: it must"):
        get_method("ctpo").trainer_class(EMBEDDED_POLICY_PATH, length_reward, args=args, train_dataset=tiny_dataset(8))


def test_a_zero_count_is_refused_by_the_method_config_not_trls_division(tmp_path):
    for option in ("num_generations", "gradient_accumulation_steps", "per_device_train_batch_size"):
        with pytest.raises(ValueError, match=rf"^ECHOConfig: {option}=0: "):
            method_config("echo", tmp_path, **{option: 0})
