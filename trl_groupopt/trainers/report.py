"""The mechanism report of `GroupOptTrainer`: whether the method's mechanism acted, per optimizer step and per run.

The definitions are the methods' (`trl_groupopt/methods/<method>.py`, `MethodSpec.mechanism`; the counting is
`trl_groupopt.mechanism.MechanismTracker`). This mixin feeds the tracker the values `_flush_metrics` logs for each
training micro-batch, closes each optimizer step from a callback (logging `acted/<method>`: 1 or 0), and at the end of
`train()` prints the report, or warns when a mechanism never acted. `trainer.mechanism_report` gives it from Python at
any time (the steps trained so far); the model card and the CLI's `results.json` state it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from transformers import TrainerCallback

from ..mechanism import Mechanism, MechanismReport, MechanismTracker
from ..methods import grpo, otb

if TYPE_CHECKING:
    from trl import GRPOConfig

    from ..spec import MethodSpec

__all__ = ["MechanismReportMixin", "advantage_estimator"]


def advantage_estimator(args: GRPOConfig, spec: MethodSpec) -> str:
    """The advantages the run trains on: the config's `advantage_estimator` when it has one, else the method's own
    (OTB's token baseline for OTB, TRL's group-normalised advantages for every other method)."""
    return getattr(args, "advantage_estimator", None) or ("otb" if spec.name == otb.METHOD.name else "grpo")


class _StepEnd(TrainerCallback):
    """Closes the tracker's optimizer step (before the step's log: `on_step_end` precedes `_maybe_log_save_evaluate`)."""

    def __init__(self, trainer: MechanismReportMixin) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._mechanism_tracker.reset()

    def on_step_end(self, args, state, control, **kwargs):
        for metric, value in self.trainer._mechanism_tracker.end_step().items():
            self.trainer.log_step_metric(metric, value)


class MechanismReportMixin:
    """Mixed into `GroupOptTrainer` (see the module docstring); `_start_mechanism_report` is called at the end of
    its `__init__`."""

    @classmethod
    def method_for(cls, args: GRPOConfig) -> MethodSpec:
        """The registered method a configuration of this trainer runs (a mode may be its own method: GRPO-fix)."""
        return cls.method_spec

    def mechanisms(self) -> tuple[Mechanism, ...]:
        """The mechanisms this run reports: its method's, and OTB's token baseline when the advantages are OTB's."""
        spec = self.method_for(self.args)
        found = []
        # a subclass with its own objective that kept the base's spec is not GRPO: no definition fits it
        if spec.mechanism is not None and not (spec is grpo.METHOD and self.has_own_objective):
            found.append(spec.mechanism)
        if advantage_estimator(self.args, spec) == "otb" and otb.MECHANISM not in found:
            found.append(otb.MECHANISM)
        return tuple(found)

    def _start_mechanism_report(self) -> None:
        self._mechanism_tracker = MechanismTracker(self.mechanisms())
        if self._mechanism_tracker.mechanisms:
            self.add_callback(_StepEnd(self))

    def log_step_metric(self, name: str, value: float) -> None:
        """Log `value` under `name` with the trainer's next log (averaged, as TRL's metrics, over the values since)."""
        self._metrics["train"][name].append(value)

    def _record_mechanism_value(self, mode: str, name: str, value: float) -> None:
        """One training micro-batch's logged metric, for the tracker (`MetricsMixin._flush_metrics` calls it)."""
        tracker = self.__dict__.get("_mechanism_tracker")
        if mode == "train" and tracker is not None:
            tracker.record(name, value)

    @property
    def mechanism_report(self) -> MechanismReport | None:
        """Whether the method's mechanism acted, over the optimizer steps of the last `train()` call so far (None for
        a method without a definition). `str(report)` is the text `train()` prints; `.to_dict()` is JSON-ready."""
        tracker = self.__dict__.get("_mechanism_tracker")
        if tracker is None or not tracker.mechanisms:
            return None
        spec = self.method_for(self.args)
        return tracker.report(spec.name, advantage_estimator(self.args, spec))

    def train(self, *args, **kwargs):
        """`Trainer.train`, then the mechanism report: printed, or a warning when a mechanism never acted."""
        output = super().train(*args, **kwargs)
        report = self.mechanism_report
        if report is not None and self.is_world_process_zero():
            if report.never_acted:
                warnings.warn(report.text, UserWarning, stacklevel=2)
            else:
                print(report.text, flush=True)
        return output
