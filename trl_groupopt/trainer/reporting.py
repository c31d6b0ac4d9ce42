"""What a training run shows while it runs and leaves behind: log lines, a progress bar, the held-out accuracy,
``results.json`` and a plot. Used by :mod:`trl_groupopt.cli` and the notebook; usable with any trainer."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from transformers.trainer_callback import ExportableState, ProgressCallback, TrainerCallback

from ..comparison.runs import jsonable

__all__ = ["HeldOutAccuracyCallback", "ReadableProgressCallback", "RunHistoryCallback", "distinct_series",
           "format_log_line", "logged_points", "plain_warnings", "plot_reward_accuracy", "write_results"]  # fmt: skip

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # trl_groupopt/
#: Training-log keys shown on each line, in this order (label, key); the method's headline metric is added.
_LINE_KEYS = (("reward", "reward"), ("acc", "rewards/accuracy_reward/mean"), ("loss", "loss"),
              ("len", "completions/mean_length"))  # fmt: skip
#: The training series of the reward panel, in drawing order: (logged key, label, marker).
TRAINING_SERIES = (("reward", "reward (train)", "o"),
                   ("rewards/accuracy_reward/mean", "accuracy (train, sampled)", "x"))  # fmt: skip


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def format_log_line(logs: dict[str, Any], step: int, max_steps: int, headline_metric: str | None = None,
                    start_step: int = 0) -> str:  # fmt: skip
    """One line per log event, the same fields in the same order (``step  10/60 | reward 0.412 | acc 0.312 | loss
    -0.0104 | len 30.1 | echo/batch_clipped 0 | 3.9 s/step``); the final summary: ``done in 52.1 s (60 steps)``, or
    after resuming at step 20 (`start_step`): ``done in 12.9 s (10 steps, 21-30 of 30)``."""
    if "train_runtime" in logs:
        if not start_step:
            return f"done in {logs['train_runtime']:.1f} s ({step} steps)"
        return f"done in {logs['train_runtime']:.1f} s ({step - start_step} steps, {start_step + 1}-{step} of {max_steps})"
    keys = _LINE_KEYS + (((headline_metric, headline_metric),) if headline_metric else ())
    parts = [f"step {step:>{len(str(max_steps))}}/{max_steps}"]
    # a metric not measured on these steps (None: e.g. DFPO's shrink with no group to re-weight) is left out
    parts += [f"{label} {_fmt(logs[key])}" for label, key in keys if logs.get(key) is not None]
    parts += [f"{float(logs['step_time']):.2g} s/step"] if "step_time" in logs else []
    return " | ".join(parts)


class ReadableProgressCallback(ProgressCallback):
    """transformers' progress bar, with each log event written as one :func:`format_log_line` line instead of a dict.
    Replaces both ``ProgressCallback`` and ``PrinterCallback`` (``show_bar=False``: the lines without the bar)."""

    def __init__(self, headline_metric: str | None = None, show_bar: bool = True):
        super().__init__()
        self.headline_metric, self.show_bar, self.start_step = headline_metric, show_bar, 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = state.global_step  # > 0 when resumed: the checkpoint's state is loaded by now
        if self.show_bar:
            super().on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            super().on_step_end(args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            line = format_log_line(logs, state.global_step, state.max_steps, self.headline_metric, self.start_step)
            if self.training_bar is not None:
                self.training_bar.write(line)
            else:
                print(line, flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            super().on_train_end(args, state, control, **kwargs)


@contextlib.contextmanager
def plain_warnings() -> Iterator[None]:
    """Within it, a warning attributed to the library's own code is shown without that source line (a line of this
    package, e.g. `trainer.train(...)` in `trl_groupopt.cli.script`, tells a command-line user nothing); the others as Python shows them."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        inside = os.path.abspath(filename).startswith(_PACKAGE + os.sep)
        shown(message, category, filename, lineno, file, "" if inside else line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def write_results(output_dir: str, **results: Any) -> str:
    """Write ``results`` to ``output_dir/results.json`` (NaN as null); returns the path."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "results.json"), "w") as handle:
        handle.write(json.dumps(jsonable(results), indent=2) + "\n")
    return handle.name


class HeldOutAccuracyCallback(TrainerCallback):
    """Greedy accuracy on a small held-out set every ``every`` optimizer steps (``<= 0``: never), on the main process
    (greedy decoding draws no random numbers: the training samples do not change). Kept in :attr:`points`
    (``[(step, accuracy)]``) and logged as ``heldout/accuracy`` through ``trainer.log_step_metric`` when it has one."""

    def __init__(self, trainer, dataset, every: int, points: list | None = None) -> None:
        self.trainer, self.dataset, self.every = trainer, dataset, every
        self.max_new_tokens = getattr(trainer.args, "max_completion_length", None) or 48
        self.points: list[tuple[int, float]] = [] if points is None else points  # a resumed run's: its earlier ones

    def _measure(self, state) -> float | None:
        if self.every <= 0 or state.global_step % self.every or not state.is_world_process_zero:
            return None
        if any(step == state.global_step for step, _ in self.points):  # a resumed run's first step: measured then
            return None
        from ..data.offline import greedy_accuracy

        model, tokenizer = self.trainer.model, self.trainer.processing_class
        accuracy = greedy_accuracy(model, tokenizer, self.dataset, max_new_tokens=self.max_new_tokens)["accuracy"]
        self.points.append((state.global_step, accuracy))
        return accuracy

    def on_train_begin(self, args, state, control, **kwargs):
        self._measure(state)  # the curve's start (step 0, or the step a resumed run starts from)

    def on_step_end(self, args, state, control, **kwargs):
        accuracy = self._measure(state)
        if accuracy is not None and hasattr(self.trainer, "log_step_metric"):
            self.trainer.log_step_metric("heldout/accuracy", accuracy)


class RunHistoryCallback(TrainerCallback, ExportableState):
    """What ``results.json`` says of the whole run, saved in every checkpoint (``trainer_state.json``) so that a resumed
    run reports the whole run, not the part since the resume: the held-out accuracy before training (not measured
    again), the held-out curve's points, and the wall time of the sessions before this one."""

    def __init__(self, before: float | None = None, curve: Sequence = (), earlier_seconds: float = 0.0) -> None:
        self.before, self.curve, self.earlier_seconds = before, [tuple(p) for p in curve], float(earlier_seconds)
        self.start = time.perf_counter()

    @property
    def wall_seconds(self) -> float:
        """The whole run's wall time so far: the earlier sessions' and this one's."""
        return self.earlier_seconds + time.perf_counter() - self.start

    def state(self) -> dict[str, Any]:
        attributes = {
            "before": self.before,
            "curve": [list(p) for p in self.curve],
            "earlier_seconds": self.wall_seconds,
        }
        return {"args": {}, "attributes": attributes}

    def before_accuracy(self, measure: Callable[[], float], say: Callable[[str], None], prompts: int) -> float:
        """The held-out accuracy before training: ``measure()``d and said, or, in a resumed run, the one its first
        session measured (said as such)."""
        if self.before is not None:
            say(f"held-out greedy accuracy before training ({prompts} prompts): {self.before:.1%}, as measured before "
                "the run's first session")  # fmt: skip
            return self.before
        say(f"held-out greedy accuracy before training ({prompts} prompts)...")
        self.before = measure()
        say(f"  {self.before:.1%}")
        return self.before

    @classmethod
    def of_checkpoint(cls, checkpoint: str | None) -> RunHistoryCallback:
        """The history saved in `checkpoint` (a resumed run's), else a fresh one."""
        try:
            saved = json.loads(Path(checkpoint, "trainer_state.json").read_text())["stateful_callbacks"][cls.__name__]
            return cls(**saved["attributes"])
        except (TypeError, OSError, KeyError, ValueError):  # no checkpoint, or one saved before this history
            return cls()


def logged_points(log_history: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of ``key``'s finite numeric values in a trainer's ``log_history``."""
    return [(e["step"], e[key]) for e in log_history
            if isinstance(e.get(key), (int, float)) and "step" in e and not math.isnan(e[key])]  # fmt: skip


def _same_points(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return len(a) == len(b) and all(sa == sb and math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-12)
                                    for (sa, va), (sb, vb) in zip(a, b))  # fmt: skip


def distinct_series(log_history: Sequence[dict[str, Any]], series=TRAINING_SERIES) -> list[tuple[str, list, str]]:
    """The ``series`` that were logged, each once: a series equal to an earlier one at every step (the training
    reward and accuracy when accuracy is the only reward) is merged into it, the labels joined with " = "."""
    drawn: list[tuple[str, list, str]] = []
    for key, label, marker in series:
        points = logged_points(log_history, key)
        same = next((i for i, (_, other, _) in enumerate(drawn) if _same_points(other, points)), None)
        if points and same is None:
            drawn.append((label, points, marker))
        elif points:
            drawn[same] = (f"{drawn[same][0]} = {label}", drawn[same][1], drawn[same][2])
    return drawn


def _draw_mechanism(ax, log_history: Sequence[dict[str, Any]], report) -> None:
    """The mechanisms' logged metrics per logged step, and the share of each log's steps on which they acted."""
    for outcome in report.outcomes:
        for key in (mechanism := outcome.mechanism).watched_keys:
            if points := logged_points(log_history, key):
                ax.plot(*zip(*points), marker=".", markersize=3, linewidth=1, label=key)
        if acted := logged_points(log_history, mechanism.metric):
            ax.plot(*zip(*acted), linestyle="none", marker="x", markersize=5, color="black",
                    label=f"{mechanism.metric} (share of the logged steps)")  # fmt: skip
    ax.set_title("\n".join(f"{o.mechanism.name}: acted on {o.acted} of {o.steps} optimizer steps"
                           + (f" ({o.undefined} more undefined)" if o.undefined else "")
                           for o in report.outcomes), fontsize=9)  # fmt: skip
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot_reward_accuracy(log_history: Sequence[dict[str, Any]], path: str, *,
                         heldout: Sequence[tuple[int, float]] = (), heldout_curve: Sequence[tuple[int, float]] = (),
                         heldout_label: str = "accuracy (held-out, greedy)",
                         curve_label: str = "accuracy (held-out slice, greedy)", mechanism_report=None,
                         title: str = "") -> str:  # fmt: skip
    """Plot a run to ``path`` (PNG); returns the path. Top: each distinct training series
    (:func:`distinct_series`), ``heldout_curve`` (a line) and the full evaluations ``heldout`` (points: nothing was
    measured in between). Bottom, with a ``mechanism_report``: its mechanisms' metrics and ``acted/<method>``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if mechanism_report is not None and mechanism_report.outcomes else 1
    fig, axes = plt.subplots(rows, 1, figsize=(6.5, 3.6 * rows), dpi=100, squeeze=False)
    ax = axes[0][0]
    for label, points, marker in distinct_series(log_history):
        ax.plot(*zip(*points), marker=marker, markersize=4, label=label)
    if heldout_curve:
        ax.plot(*zip(*heldout_curve), marker="s", markersize=4, color="black", label=curve_label)
    if heldout:
        ax.plot(*zip(*heldout), linestyle="none", marker="D", markersize=7, color="tab:red", label=heldout_label)
    ax.set(xlabel="optimizer step", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    if rows == 2:
        _draw_mechanism(axes[1][0], log_history, mechanism_report)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
