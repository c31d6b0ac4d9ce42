"""The run report's callback: closes each optimizer step (`acted/<method>`, and whether it had a learning signal:
trl_groupopt/trainer/learning_signal.py, warned about once), prints the mechanism report at the end of training and,
as an `ExportableState`, is saved in every checkpoint and restored on resume, so the report counts the whole run."""

from __future__ import annotations

import warnings
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..methods.mechanism import MechanismReport, MechanismTracker
from ..methods.registry import METHODS
from .learning_signal import LearningSignal


class MechanismReportCallback(TrainerCallback, ExportableState):
    """Built from plain names, so transformers can rebuild it from a checkpoint."""

    def __init__(self, method: str | None, advantage_estimator: str) -> None:
        self.method, self.advantage_estimator = method, advantage_estimator
        # Its method's mechanism (None: a class that is no registered method), and that of the method that *is* its
        # advantage estimator (OTB's token baseline under `advantage_estimator="otb"`).
        estimator = METHODS.get(advantage_estimator)
        names = dict.fromkeys([method, estimator.name if estimator is not None and estimator.is_estimator else None])
        found = [METHODS[n].mechanism for n in names if n in METHODS]
        self.tracker = MechanismTracker(tuple(m for m in found if m is not None))
        self.signal = LearningSignal()  # every trainer's, with or without a mechanism
        self.pending: list[tuple[str, float]] = []  # `acted/<method>` values for the trainer's next log

    def state(self) -> dict[str, Any]:
        args = {"method": self.method, "advantage_estimator": self.advantage_estimator}
        return {"args": args, "attributes": {"counts": self.counts}}

    @property
    def counts(self) -> dict[str, Any]:
        return {**self.tracker.state(), "learning_signal": self.signal.state()}

    @counts.setter
    def counts(self, state: dict[str, Any]) -> None:  # transformers' `from_state` sets the attributes
        self.tracker.restore(state)
        self.signal.restore(state.get("learning_signal"))

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__) if state.global_step > 0 else None
        if isinstance(saved, dict) and saved.get("args", {}).get("method") == self.method:
            self.counts = saved["attributes"]["counts"]  # a resumed run: count the whole run
        else:
            self.tracker.reset()
            self.signal.restore(None)
        self.pending = []

    def on_step_end(self, args, state, control, **kwargs):
        # before the step's log: `on_step_end` precedes `_maybe_log_save_evaluate`
        self.pending += self.tracker.end_step(getattr(state, "global_step", None)).items()
        self._warn(state, self.signal.end_step(getattr(args, "max_steps", 0)))

    def on_train_end(self, args, state, control, **kwargs):
        """The run's report: printed, or a warning when a mechanism never acted (main process); before it, the
        learning-signal warning for a run that mostly had none."""
        self._warn(state, self.signal.end_run())
        report = self.report()
        if state.is_world_process_zero and self.tracker.mechanisms:
            if report.never_acted:  # one line: a warning's later lines stand alone on stderr
                warnings.warn(" ".join(report.text.splitlines()), UserWarning, stacklevel=1)
            else:
                print(report.text, flush=True)

    @staticmethod
    def _warn(state, text: str | None) -> None:
        if text is not None and getattr(state, "is_world_process_zero", True):
            warnings.warn(text, UserWarning, stacklevel=1)

    def report(self) -> MechanismReport:
        return self.tracker.report(self.method or "", self.advantage_estimator, self.signal.counts)
