"""Security, end to end: a training run with tokens in the environment and in the config leaves neither in its logs,
checkpoints, model cards or `training_args.bin` (the findings and the config checks: tests/trainers/test_security.py).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import set_seed
from transformers.utils import logging as hf_logging

from tests.helpers import method_trainer, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from tests.trainers.test_security import CONFIG_TOKEN, ENV_TOKEN, _leaks


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


@pytest.mark.parametrize("method", tested_methods())
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


def _pickled_args(folder) -> list:
    return sorted(folder.rglob("training_args.bin"))


@pytest.mark.parametrize("method", tested_methods())
def test_training_args_bin_holds_no_token(method, tmp_path):
    """Every method (`grpo` with TRL's plain GRPOConfig included, issue 38): the `training_args.bin` of each
    checkpoint and of the output folder hold no token, and unpickle with `hub_token=None`."""
    tokenizer = tiny_tokenizer()
    trainer = method_trainer(method, tmp_path, tiny_model(tokenizer, seed=2), tokenizer, num_generations=2,
                             max_steps=2, save_strategy="steps", save_steps=1, hub_token=CONFIG_TOKEN)  # fmt: skip
    trainer.train()
    trainer.save_model()
    paths = _pickled_args(tmp_path)
    assert len(paths) == 3, paths  # checkpoint-1, checkpoint-2, the output folder
    for path in paths:
        assert not _leaks(path.read_bytes()), path
        assert torch.load(path, weights_only=False).hub_token is None
    assert trainer.args.hub_token == CONFIG_TOKEN  # still there for push_to_hub


#: How the command line receives a token: as an option, from `--config` YAML, and shaped without the `hf_` prefix.
CLI_TOKENS = {"option": ["--hub_token", CONFIG_TOKEN], "yaml": None, "no_prefix": ["--hub_token", CONFIG_TOKEN[3:]]}


@pytest.mark.parametrize("given", list(CLI_TOKENS))
def test_cli_grpo_run_writes_no_token(given, tmp_path):
    """`trl-groupopt train --method grpo --hub_token ... --save_steps 1 --max_steps 2` (issue 38): no file of the
    output folder holds the token, however it was given."""
    from trl_groupopt.cli.main import train

    output_dir = tmp_path / "run"
    argv = ["--output_dir", str(output_dir), "--max_steps", "2", "--save_steps", "1", "--per_device_train_batch_size",
            "4", "--num_generations", "2", "--gradient_accumulation_steps", "1", "--steps_per_generation", "1",
            "--max_completion_length", "8", "--num_train_examples", "16", "--evaluate_accuracy", "false"]  # fmt: skip
    if CLI_TOKENS[given] is None:
        config = tmp_path / "config.yaml"
        config.write_text(f"hub_token: {CONFIG_TOKEN}\n", encoding="utf-8")
        argv += ["--config", str(config)]
    else:
        argv += CLI_TOKENS[given]
    train("grpo", argv)
    assert len(_pickled_args(output_dir)) == 3  # checkpoint-1, checkpoint-2, the output folder
    leaking = {str(p): _leaks(p.read_bytes()) for p in output_dir.rglob("*") if p.is_file() and _leaks(p.read_bytes())}
    assert not leaking, leaking
