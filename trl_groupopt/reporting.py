"""What a training run shows while it runs and leaves behind: readable log lines, a progress bar, ``results.json``
and a reward/accuracy plot. Used by the example scripts (:mod:`trl_groupopt.cli`); usable with any trainer."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from transformers.trainer_callback import ProgressCallback

__all__ = ["ReadableProgressCallback", "format_log_line", "plot_reward_accuracy", "write_results"]

#: Training-log keys shown on each line, in this order (label, key); the method's headline metric is added.
_LINE_KEYS = (
    ("reward", "reward"),
    ("acc", "rewards/accuracy_reward/mean"),
    ("loss", "loss"),
    ("len", "completions/mean_length"),
)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def format_log_line(logs: dict[str, Any], step: int, max_steps: int, headline_metric: str | None = None) -> str:
    """One line per log event, always the same fields in the same order, e.g.
    ``step  10/60 | reward 0.412 | acc 0.312 | loss -0.0104 | len 30.1 | echo/batch_clipped 0 | 3.9 s/step``.
    The final summary log (``train_runtime``...) gives ``done in 52.1 s (60 steps)``."""
    if "train_runtime" in logs:
        return f"done in {logs['train_runtime']:.1f} s ({step} steps)"
    width = len(str(max_steps))
    parts = [f"step {step:>{width}}/{max_steps}"]
    keys = list(_LINE_KEYS) + ([(headline_metric, headline_metric)] if headline_metric else [])
    for label, key in keys:
        if key in logs:
            parts.append(f"{label} {_fmt(logs[key])}")
    if "step_time" in logs:
        parts.append(f"{float(logs['step_time']):.2g} s/step")
    return " | ".join(parts)


class ReadableProgressCallback(ProgressCallback):
    """transformers' progress bar, with each log event written as one :func:`format_log_line` line instead of a dict.

    Replaces both ``ProgressCallback`` and ``PrinterCallback`` (``disable_tqdm=True``: the lines without the bar).
    """

    def __init__(self, headline_metric: str | None = None, show_bar: bool = True):
        super().__init__()
        self.headline_metric = headline_metric
        self.show_bar = show_bar

    def on_train_begin(self, args, state, control, **kwargs):
        if self.show_bar:
            super().on_train_begin(args, state, control, **kwargs)
        self.current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            super().on_step_end(args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        line = format_log_line(logs, state.global_step, state.max_steps, self.headline_metric)
        if self.training_bar is not None:
            self.training_bar.write(line)
        else:
            print(line, flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            super().on_train_end(args, state, control, **kwargs)


def write_results(output_dir: str, **results: Any) -> str:
    """Write ``results`` to ``output_dir/results.json`` (NaN as null); returns the path."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in results.items()}
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "results.json")
    with open(path, "w") as f:
        json.dump(clean, f, indent=2)
        f.write("\n")
    return path


def plot_reward_accuracy(
    log_history: Sequence[dict[str, Any]],
    path: str,
    *,
    heldout: Sequence[tuple[int, float]] = (),
    title: str = "",
) -> str | None:
    """Plot the training reward and sampled accuracy per logged step (markers, so one point shows) and the held-out
    greedy accuracy points ``heldout`` = [(step, accuracy), ...] to ``path`` (PNG). Returns the path, or None when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    series = (("reward", "reward (train)", "o"), ("rewards/accuracy_reward/mean", "accuracy (train, sampled)", "x"))
    for key, label, marker in series:
        points = [(e["step"], e[key]) for e in log_history if key in e and "step" in e]
        if points:
            ax.plot(*zip(*points), marker=marker, markersize=4, label=label)
    if heldout:
        ax.plot(*zip(*heldout), marker="s", linestyle="--", color="black", label="accuracy (held-out, greedy)")
    ax.set_xlabel("step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
