"""What a run leaves behind, without training (`trl_groupopt.trainer.reporting`): one line per distinct series, the plot's
mechanism panel, and the held-out accuracy measured while training. The demo's outputs, trained:
tests/e2e/test_run_report.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from trl_groupopt.methods.echo import spec as echo
from trl_groupopt.methods.mechanism import MechanismTracker
from trl_groupopt.trainer.reporting import HeldOutAccuracyCallback, distinct_series, plot_reward_accuracy

ACCURACY = "rewards/accuracy_reward/mean"


def _history(rewards, accuracies):
    return [{"reward": r, ACCURACY: a, "step": 2 * (i + 1)} for i, (r, a) in enumerate(zip(rewards, accuracies))]


def test_a_series_equal_to_another_is_drawn_once():
    """Accuracy the only reward: the training reward and accuracy are one series, drawn once under both names."""
    same = distinct_series(_history([0.25, 0.5 + 1e-15], [0.25, 0.5]))
    assert [label for label, _, _ in same] == ["reward (train) = accuracy (train, sampled)"]
    assert same[0][1] == [(2, 0.25), (4, 0.5 + 1e-15)]
    different = distinct_series(_history([1.25, 1.5], [0.25, 0.5]))  # accuracy + format reward
    assert [label for label, _, _ in different] == ["reward (train)", "accuracy (train, sampled)"]
    # NaN steps are left out; a series never logged is not drawn
    assert distinct_series([{"reward": math.nan, "step": 1}, {"reward": 0.5, "step": 2}])[0][1] == [(2, 0.5)]


def test_plot_draws_the_mechanism_panel(tmp_path):
    pytest.importorskip("matplotlib")
    tracker = MechanismTracker([echo.METHOD.mechanism])
    history = _history([0.1, 0.2], [0.1, 0.2])
    for entry, clipped in zip(history, (0.0, 1.0)):
        entry.update({"echo/batch_clipped": clipped, "echo/batch_ratio": 1.0 + clipped, "acted/echo": clipped})
        tracker.record("echo/batch_clipped", clipped)
        tracker.end_step()
    one = plot_reward_accuracy(history, str(tmp_path / "one.png"), heldout=[(0, 0.2), (4, 0.3)])
    two = plot_reward_accuracy(history, str(tmp_path / "two.png"), heldout=[(0, 0.2), (4, 0.3)],
                               heldout_curve=[(0, 0.2), (2, 0.25), (4, 0.3)],
                               mechanism_report=tracker.report("echo", "grpo"))  # fmt: skip
    from PIL import Image

    (w1, h1), (w2, h2) = Image.open(one).size, Image.open(two).size
    assert w1 == w2 and h2 > 1.8 * h1  # a second panel below the first


class _Recorder:
    """A trainer stand-in: the model and tokenizer the callback evaluates, and `log_step_metric`."""

    def __init__(self, model, tokenizer):
        self.model, self.processing_class = model, tokenizer
        self.args = SimpleNamespace(max_completion_length=4)
        self.logged = []

    def log_step_metric(self, name, value):
        self.logged.append((name, value))


def test_heldout_accuracy_every_k_steps(tokenizer, base_model):
    """Measured at the start and every `every` optimizer steps, on the main process, and logged with the next log."""
    from trl_groupopt.data.offline import make_arithmetic_dataset

    trainer = _Recorder(base_model, tokenizer)
    callback = HeldOutAccuracyCallback(trainer, make_arithmetic_dataset(4, split="test"), every=3)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback.on_train_begin(None, state, None)
    for step in range(1, 7):
        state.global_step = step
        callback.on_step_end(None, state, None)
    assert [step for step, _ in callback.points] == [0, 3, 6]
    assert all(0 <= accuracy <= 1 for _, accuracy in callback.points)
    assert [name for name, _ in trainer.logged] == ["heldout/accuracy"] * 2  # steps 3 and 6 (step 0: not a log)
    other_rank = HeldOutAccuracyCallback(trainer, make_arithmetic_dataset(4, split="test"), every=1)
    other_rank.on_step_end(None, SimpleNamespace(global_step=1, is_world_process_zero=False), None)
    off = HeldOutAccuracyCallback(trainer, make_arithmetic_dataset(4, split="test"), every=0)
    off.on_step_end(None, SimpleNamespace(global_step=1, is_world_process_zero=True), None)
    assert other_rank.points == off.points == []


def test_the_final_line_counts_the_steps_trained_this_time(capsys):
    """Was: "done in 12.9 s (30 steps)" after resuming 20 of 30 steps (issue 46, friction)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from trl_groupopt.trainer.reporting import ReadableProgressCallback, format_log_line

    assert format_log_line({"train_runtime": 52.14}, 60, 60) == "done in 52.1 s (60 steps)"
    callback = ReadableProgressCallback(show_bar=False)
    state = TrainerState(global_step=20, max_steps=30)  # a resumed run: the checkpoint's state, loaded
    callback.on_train_begin(TrainingArguments(output_dir="unused", report_to="none"), state, TrainerControl())
    state.global_step = 30
    callback.on_log(None, state, None, logs={"train_runtime": 12.94})
    assert capsys.readouterr().out == "done in 12.9 s (10 steps, 21-30 of 30)\n"
