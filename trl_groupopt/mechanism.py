"""Whether a method's mechanism changed the training: one definition per method, and the run's report.

A method differs from GRPO only on the optimizer steps where its mechanism acts: ECHO's batch clip only when the
batch ratio R leaves its clip range, DFPO's re-weighting only when the GSPO ratios of a group differ from 1, and so
on. A :class:`Mechanism` says, for one method, which logged metrics decide it and when they mean "it acted on this
optimizer step" (:attr:`Mechanism.acts`, a predicate on the step's mean of each metric). The shipped definitions live
beside each method's spec (``trl_groupopt/methods/<method>.py``, ``METHOD.mechanism``); the trainers
(``GroupOptTrainer``: the ``acted/<method>`` metric every optimizer step, ``trainer.mechanism_report`` and the report
``train()`` prints) and the stress benchmark (``benchmarks/stress.py``, through :data:`MECHANISM_ACTS`) read the same
definitions.

:class:`MechanismTracker` is the trainer-independent part: it receives the values a trainer logs for each micro-batch
(:meth:`~MechanismTracker.record`), closes an optimizer step (:meth:`~MechanismTracker.end_step`, which evaluates the
definition on the step's mean values) and builds the :class:`MechanismReport`. Pure Python: no torch, no TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Mechanism", "MechanismOutcome", "MechanismReport", "MechanismTracker", "Observed"]


@dataclass(frozen=True)
class Observed:
    """A logged metric the report quotes beside the count, e.g. the range of ECHO's R.

    ``stat`` is ``"range"`` (the smallest and largest micro-batch value of the run) or ``"mean"`` (their mean)."""

    label: str  # how the report names it, e.g. "R"
    key: str  # the logged metric, e.g. "echo/batch_ratio"
    stat: str = "range"

    def __post_init__(self) -> None:
        if self.stat not in ("range", "mean"):
            raise ValueError(f"Observed.stat must be 'range' or 'mean', got {self.stat!r}.")


@dataclass(frozen=True)
class Mechanism:
    """What "the mechanism acted on this optimizer step" means for one method.

    ``acts`` receives, in the order of ``keys``, the step's mean of each logged metric (the mean over the step's
    micro-batches, as TRL logs a step with ``logging_steps=1``) and returns whether the mechanism changed the objective
    on that step. A step where a key was not logged or is NaN is not measured (not counted either way).
    """

    method: str  # the registry name the definition belongs to, e.g. "echo"; the per-step metric is `acted/<method>`
    name: str  # the report's subject, e.g. "ECHO's batch clip"
    what: str  # what acting means on one step, e.g. "the batch ratio R was clipped"
    keys: tuple[str, ...]  # the logged metrics `acts` reads
    acts: Callable[..., bool]
    observed: tuple[Observed, ...] = ()  # what the report quotes beside the count
    inert: str = ""  # what a run on which it never acted trained as, e.g. "this run trained as GSPO"
    hint: str = ""  # how to make it act (config knobs), completing "to make it act, ..."

    @property
    def metric(self) -> str:
        """The metric logged every optimizer step: 1 when the mechanism acted, 0 when not (TRL averages it over the
        steps of each log, so with ``logging_steps=k`` it reads as the fraction of those k steps)."""
        return f"acted/{self.method}"

    @property
    def watched_keys(self) -> tuple[str, ...]:
        """Every logged metric the definition and the report read."""
        return tuple(dict.fromkeys((*self.keys, *(o.key for o in self.observed))))

    def acted_on(self, values: Mapping[str, float | None]) -> bool | None:
        """Whether it acted on a step whose mean metrics are ``values``; None when the step did not measure it."""
        args = [values.get(key) for key in self.keys]
        if any(v is None or math.isnan(v) for v in args):
            return None
        return bool(self.acts(*args))


@dataclass
class MechanismOutcome:
    """One mechanism over one run: on how many measured optimizer steps it acted, and what the report quotes."""

    mechanism: Mechanism
    steps: int = 0  # optimizer steps on which it was measured
    acted: int = 0  # of those, the steps on which it acted
    observed: dict[str, tuple[float, float] | float] = field(default_factory=dict)  # label -> (min, max) or mean

    @property
    def never_acted(self) -> bool:
        """Measured on at least one step and acted on none."""
        return self.steps > 0 and self.acted == 0

    def _observed_text(self) -> str:
        parts = []
        for item in self.mechanism.observed:
            value = self.observed.get(item.label)
            if isinstance(value, tuple):
                parts.append(f"{item.label} within [{value[0]:.4f}, {value[1]:.4f}]")
            elif value is not None:
                parts.append(f"{item.label}: mean {value:.3g}")
        return "; ".join(parts)

    @property
    def text(self) -> str:
        """One sentence, e.g. "ECHO's batch clip acted on 0 of 80 optimizer steps (R within [0.954, 1.008]): this
        run trained as ...; to make it act, ..."."""
        m = self.mechanism
        if not self.steps:
            return f"{m.name}: not measured (no optimizer step logged {', '.join(m.keys)})."
        observed = self._observed_text()
        head = f"{m.name} acted on {self.acted} of {self.steps} optimizer steps" + (
            f" ({observed})" if observed else ""
        )
        if self.acted:
            return f"{head}: {m.what} on {self.acted / self.steps:.0%} of them."
        tail = "; ".join(part for part in (m.inert, f"to make it act, {m.hint}" if m.hint else "") if part)
        return f"{head}: {tail}." if tail else f"{head}."

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the definition's names, the counts and the quoted values."""
        m = self.mechanism
        return {
            "method": m.method,
            "mechanism": m.name,
            "acted_means": m.what,
            "metric": m.metric,
            "steps": self.steps,
            "acted": self.acted,
            "fraction": self.acted / self.steps if self.steps else None,
            "observed": {k: list(v) if isinstance(v, tuple) else v for k, v in self.observed.items()},
            "text": self.text,
        }


@dataclass
class MechanismReport:
    """What the run's mechanisms did: one :class:`MechanismOutcome` per mechanism, and the advantage estimator."""

    method: str  # the registry name of the method that ran, e.g. "grpo_fix"
    advantage_estimator: str  # the advantages the objective was trained on, e.g. "grpo" (group-normalised)
    outcomes: list[MechanismOutcome]

    @property
    def never_acted(self) -> list[MechanismOutcome]:
        """The outcomes of mechanisms measured on some step that acted on none."""
        return [outcome for outcome in self.outcomes if outcome.never_acted]

    @property
    def text(self) -> str:
        lines = [outcome.text for outcome in self.outcomes]
        lines.append(f"Advantage estimator: {self.advantage_estimator}.")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``results.json``'s ``mechanism``)."""
        return {
            "method": self.method,
            "advantage_estimator": self.advantage_estimator,
            "mechanisms": [outcome.to_dict() for outcome in self.outcomes],
            "text": self.text,
        }


class MechanismTracker:
    """Counts, per optimizer step, whether each of a run's mechanisms acted (see the module docstring)."""

    def __init__(self, mechanisms: Iterable[Mechanism]) -> None:
        self.mechanisms = tuple(mechanisms)
        self.keys = frozenset(key for m in self.mechanisms for key in m.watched_keys)
        self.reset()

    def reset(self) -> None:
        """Forget every step (a new `train()` call)."""
        self._step: dict[str, list[float]] = {}  # key -> this step's finite micro-batch values
        self._counts = {m.method: [0, 0] for m in self.mechanisms}  # method -> [steps measured, steps acted]
        self._values: dict[str, list[float]] = {}  # key -> [min, max, sum, count] over the run

    def record(self, key: str, value: float) -> None:
        """One micro-batch's logged value of ``key`` (ignored unless a mechanism reads it, or NaN)."""
        if key not in self.keys or value is None or math.isnan(value):
            return
        self._step.setdefault(key, []).append(value)
        stats = self._values.setdefault(key, [value, value, 0.0, 0])
        stats[0], stats[1] = min(stats[0], value), max(stats[1], value)
        stats[2] += value
        stats[3] += 1

    def end_step(self) -> dict[str, float]:
        """Close an optimizer step: evaluate every mechanism on the step's mean values; returns ``{metric: 1.0 or
        0.0}`` for the mechanisms the step measured (the ``acted/<method>`` metrics to log)."""
        means = {key: sum(values) / len(values) for key, values in self._step.items()}
        self._step = {}
        logged = {}
        for m in self.mechanisms:
            acted = m.acted_on(means)
            if acted is None:
                continue
            counts = self._counts[m.method]
            counts[0] += 1
            counts[1] += acted
            logged[m.metric] = float(acted)
        return logged

    def report(self, method: str, advantage_estimator: str) -> MechanismReport:
        """The report of the steps closed so far."""
        outcomes = []
        for m in self.mechanisms:
            observed: dict[str, tuple[float, float] | float] = {}
            for item in m.observed:
                stats = self._values.get(item.key)
                if stats:
                    observed[item.label] = (stats[0], stats[1]) if item.stat == "range" else stats[2] / stats[3]
            steps, acted = self._counts[m.method]
            outcomes.append(MechanismOutcome(m, steps=steps, acted=acted, observed=observed))
        return MechanismReport(method=method, advantage_estimator=advantage_estimator, outcomes=outcomes)
