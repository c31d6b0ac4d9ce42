"""The door's effect on training (issue 30): plain-string prompts sent to a chat model as user messages earn reward
where the raw strings earned none, and an error raised while training keeps its traceback at the console (errors
before training are one line: tests/test_cli_help.py)."""

from __future__ import annotations

import json

import pytest
import transformers

from trl_groupopt.cli import main as cli
from trl_groupopt.data.offline import make_arithmetic_dataset

FAST = ["--max_steps", "2", "--logging_steps", "1", "--save_strategy", "no"]


@pytest.fixture(scope="module")
def string_prompts(tmp_path_factory):
    """64 rows of the synthetic task as `{"prompt": "Compute 12+7-30", "solution": "-11"}`: plain strings."""
    path = tmp_path_factory.mktemp("data") / "strings.jsonl"
    rows = [{"prompt": r["prompt"][0]["content"], "solution": str(r["answer"])} for r in make_arithmetic_dataset(64)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _first_reward(trainer) -> float:
    return next(entry["reward"] for entry in trainer.state.log_history if "reward" in entry)


def test_string_prompts_as_user_messages_earn_reward_where_raw_strings_earn_none(string_prompts, tmp_path):
    wrapped = cli.train("echo", ["--dataset_name", string_prompts, *FAST, "--output_dir", str(tmp_path / "wrapped")])
    with pytest.warns(UserWarning, match="'prompt' holds plain strings"):
        raw = cli.train("echo", ["--dataset_name", string_prompts, "--string_prompts", "raw", *FAST,
                                 "--output_dir", str(tmp_path / "raw")])  # fmt: skip
    assert _first_reward(raw) == 0.0  # the model continues the raw text: no boxed answer, no reward
    assert _first_reward(wrapped) > 0.05


def test_an_error_raised_while_training_keeps_its_traceback(tmp_path, monkeypatch):
    def fails_mid_run(*args, **kwargs):
        raise RuntimeError("failed mid-run")

    monkeypatch.setattr(transformers.Trainer, "_inner_training_loop", fails_mid_run)
    argv = ["train", "--method", "echo", "--num_train_examples", "16", "--evaluate_accuracy", "false",
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    with pytest.raises(RuntimeError, match="failed mid-run"):  # not SystemExit: the console shows the traceback
        cli.main(argv)
