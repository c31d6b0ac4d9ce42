"""What a new user met (issue 51, items 2 and 9) that needs no training run: a malformed `.jsonl` is said once, by the
library, naming the file's line (the datasets library printed its own error, counting rows from 0, with progress
bars); the card's quick start asks the embedded policy its own task; the run's report warns in one line; the warnings
TRL 1.16 on transformers 5 raises that no user can act on are hidden while training (the run: tests/e2e/)."""

from __future__ import annotations

import logging
import warnings

import pytest

from trl_groupopt.data.adapters import load_raw_dataset
from trl_groupopt.trainer import card

GOOD = '{"prompt": "Compute 1+%d", "solution": "%d"}\n'


def test_a_malformed_jsonl_is_said_once_by_the_library_naming_the_line(tmp_path, capfd, caplog):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(GOOD % (i, i + 1) for i in range(4)) + '{"prompt": "Compute 1+5" "solution": "6"}\n')
    with caplog.at_level(logging.DEBUG), pytest.raises(ValueError, match=r"bad.jsonl: line 5 is not one JSON object"):
        load_raw_dataset(str(path))
    out, err = capfd.readouterr()
    assert "Failed to load JSON" not in out + err + caplog.text and "Generating train split" not in out + err
    assert "row 4" not in out + err + caplog.text


def test_datasets_progress_bars_and_logging_come_back_after_a_load(tmp_path):
    import datasets

    path = tmp_path / "good.jsonl"
    path.write_text("".join(GOOD % (i, i + 1) for i in range(4)))
    level = logging.getLogger("datasets").level
    assert len(load_raw_dataset(str(path))) == 4
    assert not datasets.are_progress_bars_disabled() and logging.getLogger("datasets").level == level


def test_the_embedded_policy_card_asks_its_own_task_whatever_the_data():
    """Was: TRL's time-machine question for the 1 M-parameter arithmetic policy trained on the user's data."""
    assert card._question("my_word_problems.jsonl", "embedded") == card.ARITHMETIC_QUESTION
    assert card._question(None, "embedded") == card.ARITHMETIC_QUESTION
    assert card._question("my_chat.jsonl", "hub") == card.GENERIC_QUESTION


@pytest.mark.parametrize(
    ("message", "category"),
    [
        ("`gradient_checkpointing_enable` is deprecated and will be removed in v6.", FutureWarning),
        ("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning),
        ("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used",
         UserWarning),
    ],
)  # fmt: skip
def test_the_stacks_noise_is_hidden_while_training_and_nothing_else(message, category):
    from trl_groupopt.trainer.compat import stack_noise_hidden

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with stack_noise_hidden():
            warnings.warn(message, category, stacklevel=1)
            warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
        warnings.warn(message, category, stacklevel=1)  # outside: shown
    assert [str(w.message) for w in caught] == ["a warning of the user's own", message]


def test_the_report_warning_is_one_line(tmp_path):
    from transformers import TrainerState

    from trl_groupopt.trainer.report import MechanismReportCallback

    callback = MechanismReportCallback("echo", "grpo")
    callback.tracker.record("echo/batch_clipped", 0.0)
    callback.on_step_end(None, None, None)
    with pytest.warns(UserWarning) as caught:
        callback.on_train_end(None, TrainerState(), None)
    (text,) = [str(w.message) for w in caught if "batch clip" in str(w.message)]
    assert "\n" not in text and text.endswith("Advantage estimator: grpo.")


def test_the_command_lines_report_comes_after_its_progress_bar(tmp_path):
    """Was: the report's warning landed on the progress bar's line (the report's callback ran before the bar's)."""
    from trl_groupopt.cli import main as cli
    from trl_groupopt.cli import script
    from trl_groupopt.data import offline
    from trl_groupopt.trainer.report import MechanismReportCallback
    from trl_groupopt.trainer.reporting import ReadableProgressCallback

    script_args, args, model_args, _ = cli.parse("echo", ["--output_dir", str(tmp_path), "--max_steps", "2"])
    trainer = script._build_trainer("echo", script_args, args, model_args, offline.make_arithmetic_dataset(64))
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert kinds.index(ReadableProgressCallback) < kinds.index(MechanismReportCallback) == len(kinds) - 1


def test_train_method_grpo_shows_no_gradient_checkpointing_warning(tmp_path, monkeypatch):
    """Was: a `gradient_checkpointing` FutureWarning from TRL's GRPOConfig default, on every `train --method grpo`."""
    from trl_groupopt.cli import main as cli
    from trl_groupopt.data import adapters

    def stop(*args, **kwargs):
        raise SystemExit(0)

    monkeypatch.setattr(adapters, "load_datasets", stop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit):
            cli.train("grpo", ["--output_dir", str(tmp_path / "out")])
    assert [str(w.message) for w in caught if "checkpointing" in str(w.message)] == []


def test_a_log_line_leaves_out_a_metric_not_measured():
    """Was: `dfpo/shrink None` on every line of a run whose groups had no reward contrast."""
    from trl_groupopt.trainer.reporting import format_log_line

    line = format_log_line({"reward": 0.0, "loss": 0.0, "dfpo/shrink": None}, 3, 40, "dfpo/shrink")
    assert line == "step  3/40 | reward 0 | loss 0" and "None" not in line
