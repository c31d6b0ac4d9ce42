"""Security defaults: no remote code by default, and no access token in logs, checkpoints or model cards.

Findings fixed here (in `TokenSafeConfigMixin`, trainers/base.py):

* `training_args.bin` (transformers pickles the whole config into every checkpoint and into `output_dir` on
  `save_model`/`push_to_hub`, and uploads it with `push_to_hub`) held `hub_token` verbatim: the method configs now
  drop `*_token` fields from their pickled state. The base trainer with TRL's plain `GRPOConfig` still pickles it
  (upstream behaviour): use `HF_TOKEN` / `hf auth login` rather than `hub_token` there.
* `repr()` of the method configs showed `hub_token` (`@dataclass` regenerates `__repr__`): it is now the redacting
  `str()` of `TrainingArguments`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import set_seed
from transformers.utils import logging as hf_logging
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs, method_trainer, tiny_model, tiny_tokenizer
from trl_groupopt import METHODS, cli, registry

REPO = Path(__file__).resolve().parents[2]
# Shaped like real access tokens (hf_ + 34 characters); two of them, to tell the environment from the config.
ENV_TOKEN = "hf_" + "EnvSecret0123456" * 2 + "ab"
CONFIG_TOKEN = "hf_" + "CfgSecret6543210" * 2 + "cd"
SECRETS = (ENV_TOKEN, CONFIG_TOKEN, "EnvSecret0123456", "CfgSecret6543210")

# The registered methods' own configs (TRL's plain GRPOConfig keeps its upstream behaviour, see above).
METHOD_CONFIGS = sorted({spec.config_class for spec in METHODS.values()} - {GRPOConfig}, key=lambda c: c.__name__)


def _leaks(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        return [s for s in SECRETS if s.encode() in text]
    return [s for s in SECRETS if s in text]


# ------------------------------------------------------------------------------------------------ trust_remote_code
@pytest.mark.parametrize("method", list(METHODS))
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
    monkeypatch.setitem(registry._METHODS, "echo", spec)
    with pytest.raises(Stop):
        cli.train("echo", ["--model_name_or_path", "some-org/some-model", "--output_dir", "unused", "--use_cpu",
                           "--bf16", "false", "--num_train_examples", "8"])  # fmt: skip
    assert captured["model"] == "some-org/some-model"
    assert captured["args"].model_init_kwargs["trust_remote_code"] is False


# ------------------------------------------------------------------------------------------------ secrets
@pytest.fixture
def log_file(tmp_path):
    """Every logger that could print (root, transformers, trl, trl_groupopt, accelerate) at DEBUG into one file."""
    path = tmp_path / "train.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    names = ["", "transformers", "trl", "trl_groupopt", "accelerate", "datasets", "huggingface_hub"]
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    hf_verbosity = hf_logging.get_verbosity()
    for logger, _ in saved:
        if logger is logging.getLogger() or not logger.propagate:  # each record reaches the file once
            logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield path
    finally:
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
        hf_logging.set_verbosity(hf_verbosity)
        handler.close()


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_no_token_in_logs_checkpoint_or_model_card(method, tmp_path, log_file, capfd, monkeypatch):
    """1 step with HF_TOKEN in the environment and hub_token in the config, debug logging to a file, a checkpoint with
    its model card: neither token appears in the card, trainer_state.json, any other checkpoint file (except the
    pickled training_args.bin, checked by test_training_args_bin_holds_no_token), the log file, stdout/stderr or the log history."""
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", ENV_TOKEN)
    output_dir = tmp_path / "run"
    tokenizer = tiny_tokenizer()
    trainer = method_trainer(method, output_dir, tiny_model(tokenizer, seed=2), tokenizer, num_generations=2,
                             max_steps=1, save_strategy="steps", save_steps=1, hub_token=CONFIG_TOKEN,
                             log_level="debug", log_completions=True, disable_tqdm=False)  # fmt: skip
    logging.getLogger("trl_groupopt").info("training args: %s", trainer.args)  # what a user's script would log
    set_seed(0)
    trainer.train()
    trainer.save_model(str(output_dir))  # output_dir README.md, model, tokenizer

    captured = capfd.readouterr()
    log_text = log_file.read_text(encoding="utf-8")
    # transformers' own info/debug records and a user's `%s` of the config reached the file (redacted by __str__)
    assert "***** Running training *****" in log_text and "Saving model checkpoint to" in log_text
    assert "hub_token=<HUB_TOKEN>" in log_text
    card = output_dir / "README.md"
    state = output_dir / "checkpoint-1" / "trainer_state.json"
    assert card.is_file() and "trl-groupopt" in card.read_text(encoding="utf-8")
    assert state.is_file() and json.loads(state.read_text())["global_step"] == 1

    scanned = {"stdout": captured.out, "stderr": captured.err, "log file": log_text,
               "log_history": json.dumps(trainer.state.log_history)}  # fmt: skip
    pickled_args = []
    for path in sorted(p for p in output_dir.rglob("*") if p.is_file()):
        if path.name == "training_args.bin":
            pickled_args.append(path)  # checked in test_training_args_bin_holds_no_token
            continue
        scanned[str(path.relative_to(output_dir))] = path.read_bytes()
    assert {"README.md", "checkpoint-1/trainer_state.json", "checkpoint-1/model.safetensors"} <= scanned.keys()
    assert len(pickled_args) == 2  # checkpoint-1 and output_dir
    leaking = {where: _leaks(text) for where, text in scanned.items() if _leaks(text)}
    assert not leaking, leaking
    assert trainer.args.hub_token == CONFIG_TOKEN  # the token is still there for push_to_hub


@pytest.mark.slow
def test_training_args_bin_holds_no_token(tmp_path):
    tokenizer = tiny_tokenizer()
    trainer = method_trainer("echo", tmp_path, tiny_model(tokenizer, seed=2), tokenizer, num_generations=2,
                             max_steps=1, save_strategy="steps", save_steps=1, hub_token=CONFIG_TOKEN)  # fmt: skip
    trainer.train()
    path = tmp_path / "checkpoint-1" / "training_args.bin"
    assert path.is_file()
    assert not _leaks(path.read_bytes())
    assert torch.load(path, weights_only=False).hub_token is None


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
