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


def test_training_on_ones_own_file_scores_held_out_rows_and_warns_without_a_stray_source_line(tmp_path):
    """Issue 46, friction: a user's file trained with no held-out accuracy (only the synthetic task had one), and a
    mechanism that never acted warned with this package's `trainer.train(...)` source line under it. Now `train`
    holds a tenth of the rows out, scores them before and after, and the warning is the report alone."""
    import subprocess
    import sys

    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": r["prompt"][0]["content"], "solution": str(r["answer"])} for r in make_arithmetic_dataset(120)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "trl_groupopt.cli",
        "train",
        "--method",
        "echo",
        "--dataset_name",
        str(path),
        "--batch_epsilon",
        "0.9",
        *FAST,
        "--output_dir",
        str(out),
    ]  # fmt: skip  (0.9: R is never clipped)
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "12 of 120 rows held out to score greedy accuracy before and after training; 108 train" in run.stdout
    results = json.loads((out / "results.json").read_text())
    before, after = results["accuracy_before"], results["accuracy_after"]
    assert results["heldout_examples"] == 12 and before is not None and after is not None
    assert f"held-out greedy accuracy (12 prompts): {before:.1%} -> {after:.1%}" in run.stdout
    warned = [line for line in run.stderr.splitlines() if "UserWarning: ECHO's batch clip acted on 0 of 2" in line]
    assert len(warned) == 1, run.stderr[-3000:]
    assert "trainer.train(" not in run.stderr, run.stderr[-3000:]  # Python's source line of the warning, gone
