"""Security defaults: no remote code by default, and no access token in the configs' text (the training runs that
check logs, checkpoints and model cards: tests/e2e/test_security_training.py).

Findings fixed here (in `TokenSafeConfigMixin`, trainers/base.py):

* `training_args.bin` (transformers pickles the whole config into every checkpoint and into `output_dir` on
  `save_model`/`push_to_hub`, and uploads it with `push_to_hub`) held `hub_token` verbatim: the method configs now
  drop `*_token` fields from what the trainer pickles to disk or uploads (`tokens_withheld`), while `copy.deepcopy`
  and in-memory pickles keep it (issue 29: dropping it there broke copies). Issue 38: the base trainer with TRL's plain
  `GRPOConfig` (the `grpo` method) still pickled it; `tokens_withheld` now covers every `TrainingArguments` class.
* `repr()` of the method configs showed `hub_token` (`@dataclass` regenerates `__repr__`): it is now the redacting
  `str()` of `TrainingArguments`.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs
from tests.selection import tested_methods
from trl_groupopt import METHODS
from trl_groupopt.cli import main as cli
from trl_groupopt.methods import registry

REPO = Path(__file__).resolve().parents[2]
# Shaped like real access tokens (hf_ + 34 characters); two of them, to tell the environment from the config.
ENV_TOKEN = "hf_" + "EnvSecret0123456" * 2 + "ab"
CONFIG_TOKEN = "hf_" + "CfgSecret6543210" * 2 + "cd"
SECRETS = (ENV_TOKEN, CONFIG_TOKEN, "EnvSecret0123456", "CfgSecret6543210")

# The registered methods' own configs (TRL's plain GRPOConfig keeps its upstream `repr`, see above).
METHOD_CONFIGS = sorted({spec.config_class for spec in METHODS.values()} - {GRPOConfig}, key=lambda c: c.__name__)
#: Every config our trainers take, TRL's plain GRPOConfig (the `grpo` method's) included: none pickles its token to disk.
ALL_CONFIGS = [*METHOD_CONFIGS, GRPOConfig]


def _leaks(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        return [s for s in SECRETS if s.encode() in text]
    return [s for s in SECRETS if s in text]


# ------------------------------------------------------------------------------------------------ trust_remote_code
@pytest.mark.parametrize("method", tested_methods())
def test_examples_default_to_no_remote_code(method):
    """Demo (no model), a Hub model id, and the method's YAML example config: trust_remote_code stays False."""
    argvs = [[], ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--output_dir", "unused", "--use_cpu",
                  "--bf16", "false"]]  # fmt: skip
    yaml_file = REPO / "examples" / "configs" / f"{method}.yaml"
    if yaml_file.exists():
        argvs.append(["--config", str(yaml_file)])
    for argv in argvs:
        _, training_args, model_args, _ = cli.parse(method, argv)
        assert training_args.trust_remote_code is False, argv
        assert not getattr(model_args, "trust_remote_code", False), argv
    # The flag exists and is honoured (so the assertion above could fail).
    _, training_args, _, _ = cli.parse(method, ["--trust_remote_code", "true"])
    assert training_args.trust_remote_code is True


def test_example_script_passes_trust_remote_code_false_to_the_model_loader(monkeypatch):
    """`cli.train` hands `trust_remote_code=False` (from the training config) to the trainer's model loading."""
    captured = {}

    class Stop(Exception):
        pass

    def fake_trainer(**kwargs):
        captured.update(kwargs)
        raise Stop

    spec = dataclasses.replace(registry.get_method("echo"), trainer_class=fake_trainer)
    monkeypatch.setitem(registry.METHODS._entries, "echo", spec)
    with pytest.raises(Stop):
        cli.train("echo", ["--model_name_or_path", "some-org/some-model", "--output_dir", "unused", "--use_cpu",
                           "--bf16", "false", "--num_train_examples", "8"])  # fmt: skip
    assert captured["model"] == "some-org/some-model"
    assert captured["args"].model_init_kwargs["trust_remote_code"] is False


# ------------------------------------------------------------------------------------------------ secrets
@pytest.mark.parametrize("config_cls", METHOD_CONFIGS, ids=lambda c: c.__name__)
def test_config_str_redacts_the_token(config_cls, tmp_path):
    """`str(config)` (what transformers logs, and `print(config)`) and the JSON dump hide hub_token."""
    args = config_cls(**cpu_config_kwargs(tmp_path, hub_token=CONFIG_TOKEN))
    assert not _leaks(str(args)) and "hub_token=<HUB_TOKEN>" in str(args)
    assert not _leaks(args.to_json_string())


@pytest.mark.parametrize("config_cls", METHOD_CONFIGS, ids=lambda c: c.__name__)
def test_config_repr_redacts_the_token(config_cls, tmp_path):
    args = config_cls(**cpu_config_kwargs(tmp_path, hub_token=CONFIG_TOKEN))
    assert not _leaks(repr(args))


@pytest.mark.parametrize("config_cls", ALL_CONFIGS, ids=lambda c: c.__name__)
def test_copies_and_in_memory_pickles_keep_the_token(config_cls, tmp_path):
    """`copy.deepcopy`, `copy.copy` and a pickle round trip in memory keep `hub_token` (as TRL's GRPOConfig does);
    only what the trainer writes to disk or uploads (pickled under `tokens_withheld`) drops it."""
    from trl_groupopt.trainer.config import tokens_withheld

    args = config_cls(**cpu_config_kwargs(tmp_path, hub_token=CONFIG_TOKEN))
    assert copy.deepcopy(args).hub_token == CONFIG_TOKEN
    assert copy.copy(args).hub_token == CONFIG_TOKEN
    assert pickle.loads(pickle.dumps(args)).hub_token == CONFIG_TOKEN
    with tokens_withheld():
        on_disk = pickle.dumps(args)
    assert not _leaks(on_disk) and pickle.loads(on_disk).hub_token is None
    assert args.hub_token == CONFIG_TOKEN and pickle.loads(pickle.dumps(args)).hub_token == CONFIG_TOKEN  # reset


def _user_config_class() -> type:
    """A `GRPOConfig` subclass made on call (after the first `tokens_withheld`), picklable by its module name."""

    @dataclasses.dataclass
    class MyConfig(GRPOConfig):
        my_knob: int = 3

    MyConfig.__qualname__ = "MyConfig"
    globals()["MyConfig"] = MyConfig
    return MyConfig


def test_a_user_subclass_of_grpo_config_is_withheld_too(tmp_path):
    """A config class defined after the first save (a user's own `GRPOConfig` subclass) is covered as well."""
    from trl_groupopt.trainer.config import tokens_withheld

    with tokens_withheld():
        pickle.dumps(GRPOConfig(**cpu_config_kwargs(tmp_path)))  # registers the classes known so far

    args = _user_config_class()(**cpu_config_kwargs(tmp_path, hub_token="no_prefix_" + CONFIG_TOKEN[3:]))
    with tokens_withheld():
        on_disk = pickle.dumps(args)
    assert not _leaks(on_disk) and pickle.loads(on_disk).my_knob == 3
