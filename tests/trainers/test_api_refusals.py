"""Issue 52, weak: the Python API refused these only after the model loaded (by TRL or transformers), or not at all,
and two silent mislabels trained another method under a method's name. Each is now refused before the model loads
(`GRPOTrainer.__init__`, where TRL loads it, is replaced here by one that fails the test if reached), in one line
naming the argument and the fix."""

from __future__ import annotations

import pytest
from trl import GRPOTrainer

from tests.helpers import length_reward, method_config, tiny_dataset
from trl_groupopt import CTPOConfig, ECHOConfig, GroupOptTrainer
from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH
from trl_groupopt.methods.dfpo.trainer import GRPOFixConfig


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    def loads(self, *args, **kwargs):
        raise AssertionError("the model began to load before the refusal")

    monkeypatch.setattr(GRPOTrainer, "__init__", loads)


def _build(tmp_path, trainer=GroupOptTrainer, args=None, model=EMBEDDED_POLICY_PATH, **kwargs):
    kwargs = {"reward_funcs": [length_reward], "train_dataset": tiny_dataset(8), **kwargs}
    config = args if args is not None else method_config("grpo", tmp_path)
    return trainer(model, args=config, **kwargs)


CASES = {
    "max_completion_length=0": ({"args": "max_completion_length=0"}, "max_completion_length"),
    "reward weights of the wrong length": ({"args": "reward_weights"}, "reward_weights has 2 weight"),
    "reward_funcs=None": ({"reward_funcs": None}, r"No reward source provided \(reward_funcs=None\)"),
    "a function's name": ({"reward_funcs": ["no_such_fn"]}, r"reward_funcs\[0\]='no_such_fn' is read as a reward"),
    "a number": ({"reward_funcs": [42]}, r"reward_funcs\[0\]=42 \(int\) is not a reward"),
    "train_dataset=None": ({"train_dataset": None}, "train_dataset=None"),
    "a plain list": ({"train_dataset": [{"prompt": "1+1="}] * 8}, "train_dataset is a plain list"),
    "use_vllm without vLLM": ({"args": "use_vllm"}, r"use_vllm=True, but vLLM is not installed"),
    "a missing local model": ({"model": "./no_such_model_folder"}, "model ./no_such_model_folder: no such folder"),
}
ARGS = {
    "max_completion_length=0": {"max_completion_length": 0},
    "reward_weights": {"reward_weights": [1.0, 1.0]},
    "use_vllm": {"use_vllm": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_python_api_argument_is_refused_before_the_model_loads(tmp_path, case, monkeypatch):
    given, said = CASES[case]
    if "args" in given:
        given = {"args": method_config("grpo", tmp_path, **ARGS[given["args"]])}
    if case == "use_vllm without vLLM":
        monkeypatch.delitem(__import__("sys").modules, "vllm", raising=False)
    with pytest.raises((ValueError, FileNotFoundError, ImportError), match=said) as refused:
        _build(tmp_path, **given)
    assert "\n" not in str(refused.value)


def test_a_string_option_is_named_not_a_type_error():
    """`CTPOConfig(ctpo_dual_clip='0.1')` raised "'>' not supported between instances of 'str' and 'int'"."""
    with pytest.raises(ValueError, match=r"ctpo_dual_clip must be a number > 0 .*got '0.1' \(str\)"):
        CTPOConfig("out", ctpo_dual_clip="0.1")


def test_another_method_s_config_is_refused_by_the_plain_trainer(tmp_path):
    """`GroupOptTrainer(args=ECHOConfig(...))` trained plain GRPO under ECHO's config, its knobs ignored."""
    args = method_config("echo", tmp_path)
    assert isinstance(args, ECHOConfig)
    with pytest.raises(
        ValueError, match=r"GroupOptTrainer was given ECHOConfig\(\.\.\.\), .* use ECHOTrainer\(args=\.\.\.\)"
    ):
        _build(tmp_path, args=args)


@pytest.mark.parametrize("transform", ["min_replace", "none", "orth_proj"])
def test_grpo_fix_with_a_dfpo_transform_is_refused(tmp_path, transform):
    """`GRPOFixConfig(dfpo_transform='min_replace')` trained DFPO under GRPO-fix's name (card, report)."""
    with pytest.raises(ValueError, match=rf"GRPOFixConfig\(dfpo_transform='{transform}'\) would train DFPO"):
        GRPOFixConfig(str(tmp_path), dfpo_transform=transform)


def test_grpo_fix_with_a_dfpo_transform_is_refused_on_the_command_line(tmp_path):
    """`--method grpo_fix --dfpo_transform min_replace` likewise, before anything loads."""
    from trl_groupopt.cli import main as cli

    with pytest.raises(ValueError, match="would train DFPO under GRPO-fix's name"):
        cli.parse("grpo_fix", ["--output_dir", str(tmp_path / "out"), "--dfpo_transform", "min_replace"])
