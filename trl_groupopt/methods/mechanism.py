"""Whether a method's mechanism acted on each optimizer step (definitions: `trl_groupopt/methods/<name>/spec.py`), and
the run's report. Pure Python: no torch, no TRL."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Mechanism", "MechanismOutcome", "MechanismReport", "MechanismTracker", "Observed"]

#: How most hints start: ratios leave 1, and clips can act, only off-policy.
OFF_POLICY = "train further off-policy (more steps_per_generation per gradient_accumulation_steps)"


@dataclass(frozen=True)
class Observed:
    """A logged metric the report quotes: ``stat`` ``"range"`` (min and max over micro-batches) or ``"mean"``."""

    label: str  # how the report names it, e.g. "R"
    key: str  # the logged metric, e.g. "<method>/batch_ratio"
    stat: str = "range"

    def __post_init__(self) -> None:
        if self.stat not in ("range", "mean"):
            raise ValueError(f"Observed.stat must be 'range' or 'mean', got {self.stat!r}.")


@dataclass(frozen=True)
class Mechanism:
    """What "the mechanism acted on this optimizer step" means for one method: ``acts`` receives the step's mean of
    each of ``keys`` (a missing or NaN key: not measured). ``verdict`` may add a sentence from the observed values."""

    name: str  # the report's subject, e.g. "<Method>'s batch clip"
    what: str  # what acting means on one step, e.g. "the batch ratio R was clipped"
    keys: tuple[str, ...]  # the logged metrics `acts` reads
    acts: Callable[..., bool]
    inert: str  # e.g. "this run trained as GSPO"
    hint: str  # completes "to make it act, ..."
    observed: tuple[Observed, ...] = ()
    verdict: Callable[[Mapping[str, Any]], str | None] | None = None
    method: str = ""  # the registry name, set by the MethodSpec holding it; the per-step metric is `acted/<method>`

    def __post_init__(self) -> None:
        if not (self.inert and self.hint):
            raise ValueError(f"Mechanism {self.name!r}: inert and hint must say what ran and how to make it act.")

    def bound_to(self, method: str) -> Mechanism:
        """This mechanism as method `method`'s (a copy naming it; the same where it already does)."""
        if self.method not in ("", method):
            raise ValueError(f"Mechanism {self.name!r} belongs to method {self.method!r}, not {method!r}.")
        return self if self.method == method else replace(self, method=method)

    @property
    def metric(self) -> str:
        return f"acted/{self.method}"

    @property
    def watched_keys(self) -> tuple[str, ...]:  # every metric the definition and the report read
        return tuple(dict.fromkeys((*self.keys, *(o.key for o in self.observed))))

    def acted_on(self, values: Mapping[str, float | None]) -> bool | None:
        args = [values.get(key) for key in self.keys]
        if any(v is None or math.isnan(v) for v in args):
            return None
        return bool(self.acts(*args))


#: The optimizer steps an outcome names among those its metric was undefined on (it counts them all).
SHOWN_UNDEFINED_STEPS = 5


def _steps_text(count: int, steps: Sequence[int]) -> str:
    """``1 step (20)``, ``3 steps (4, 9 and 20)``, ``12 steps (1, 2, 3, 4, 5, ...)``."""
    shown = [str(s) for s in steps[:SHOWN_UNDEFINED_STEPS]]
    listed = ", ".join(shown) + ", ..." if count > len(shown) else " and ".join([", ".join(shown[:-1]), shown[-1]])
    return f"{count} step{'s' * (count != 1)} ({listed.removeprefix(' and ')})"


@dataclass
class MechanismOutcome:
    """One mechanism over one run: on how many measured optimizer steps it acted, and on how many (which) its metric
    was undefined (NaN or not logged: not counted)."""

    mechanism: Mechanism
    steps: int = 0
    acted: int = 0
    observed: dict[str, tuple[float, float] | float] = field(default_factory=dict)  # label -> (min, max) or mean
    undefined: int = 0
    undefined_steps: tuple[int, ...] = ()  # the first of them

    @property
    def never_acted(self) -> bool:
        return self.steps > 0 and self.acted == 0

    @property
    def text(self) -> str:
        m = self.mechanism
        if not self.steps:
            return f"{m.name}: not measured (no optimizer step logged {', '.join(m.keys)})."
        values = [(item.label, self.observed.get(item.label)) for item in m.observed]
        observed = "; ".join(f"{label} within [{v[0]:.4f}, {v[1]:.4f}]" if isinstance(v, tuple) else
                             f"{label}: mean {v:.3g}" for label, v in values if v is not None)  # fmt: skip
        head = f"{m.name} acted on {self.acted} of {self.steps} optimizer steps" + (f" ({observed})" * bool(observed))
        if self.acted:
            text = f"{head}: {m.what} on {self.acted / self.steps:.0%} of them."
        else:
            text = f"{head}: {m.inert}; to make it act, {m.hint}."
        if self.undefined:
            keys = " or ".join(m.keys)
            text += f" Not counted: {_steps_text(self.undefined, self.undefined_steps)} on which {keys} was undefined."
        verdict = m.verdict(self.observed) if m.verdict is not None else None
        return f"{text} {verdict}" if verdict else text

    def to_dict(self) -> dict[str, Any]:
        m, fraction = self.mechanism, self.acted / self.steps if self.steps else None
        observed = {k: list(v) if isinstance(v, tuple) else v for k, v in self.observed.items()}
        return {"method": m.method, "mechanism": m.name, "acted_means": m.what, "metric": m.metric, "steps": self.steps,
                "acted": self.acted, "fraction": fraction, "observed": observed, "undefined": self.undefined,
                "undefined_steps": list(self.undefined_steps), "text": self.text}  # fmt: skip


@dataclass
class MechanismReport:
    """What the run's mechanisms did, and the advantage estimator; with `no_signal` (steps without a learning signal,
    steps: trl_groupopt/trainer/learning_signal.py), how many steps had nothing to learn from, and no method advice
    for a run that never had anything."""

    method: str
    advantage_estimator: str
    outcomes: list[MechanismOutcome]
    no_signal: tuple[int, int] | None = None

    @property
    def signal_free(self) -> bool:
        return self.no_signal is not None and self.no_signal[1] > 0 and self.no_signal[0] == self.no_signal[1]

    @property
    def never_acted(self) -> list[MechanismOutcome]:
        return [] if self.signal_free else [outcome for outcome in self.outcomes if outcome.never_acted]

    def _outcome_text(self, outcome: MechanismOutcome) -> str:
        if not self.signal_free:
            return outcome.text
        return (
            f"{outcome.mechanism.name}: no verdict: no optimizer step had a learning signal (every group's rewards "
            "were equal), so this run says nothing about the method; give the reward a contrast first."
        )

    @property
    def text(self) -> str:
        lines = [*(self._outcome_text(o) for o in self.outcomes), f"Advantage estimator: {self.advantage_estimator}."]
        if self.no_signal is not None and self.no_signal[0]:
            lines.append(f"No learning signal on {self.no_signal[0]} of {self.no_signal[1]} optimizer steps.")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        no_signal = self.no_signal[0] if self.no_signal is not None else None
        return {"method": self.method, "advantage_estimator": self.advantage_estimator, "no_signal_steps": no_signal,
                "mechanisms": [outcome.to_dict() for outcome in self.outcomes], "text": self.text}  # fmt: skip


class MechanismTracker:
    """Counts, per optimizer step, whether each of a run's mechanisms acted (see the module docstring)."""

    def __init__(self, mechanisms: Iterable[Mechanism]) -> None:
        self.mechanisms = tuple(mechanisms)
        self.keys = frozenset(key for m in self.mechanisms for key in m.watched_keys)
        self.reset()

    def reset(self) -> None:
        self._this_step: dict[str, list[float]] = {}  # key -> this step's finite micro-batch values
        self._counts = {m.method: [0, 0] for m in self.mechanisms}  # method -> [steps measured, steps acted]
        self._undefined = {m.method: [0, []] for m in self.mechanisms}  # method -> [steps, the first of them]
        self._values: dict[str, list[float]] = {}  # key -> [min, max, sum, count] over the run
        self._closed = 0  # optimizer steps closed

    def state(self) -> dict[str, Any]:
        return {"counts": {k: list(v) for k, v in self._counts.items()}, "values": dict(self._values),
                "undefined": {k: [v[0], list(v[1])] for k, v in self._undefined.items()}, "closed": self._closed}  # fmt: skip

    def restore(self, state: Mapping[str, Any]) -> None:
        self.reset()
        self._counts.update({k: list(v) for k, v in state.get("counts", {}).items() if k in self._counts})
        self._values.update({k: list(v) for k, v in state.get("values", {}).items() if k in self.keys})
        self._undefined.update({k: [v[0], list(v[1])] for k, v in state.get("undefined", {}).items()
                                if k in self._undefined})  # fmt: skip
        steps = (self._counts[k][0] + self._undefined[k][0] for k in self._counts)  # an older state: no "closed"
        self._closed = int(state.get("closed", max(steps, default=0)))

    def record(self, key: str, value: float) -> None:
        if key not in self.keys or value is None or math.isnan(value):
            return
        self._this_step.setdefault(key, []).append(value)
        low, high, total, count = self._values.get(key, [value, value, 0.0, 0])
        self._values[key] = [min(low, value), max(high, value), total + value, count + 1]

    def end_step(self, step: int | None = None) -> dict[str, float]:
        """Close optimizer step `step` (None: the next one); returns ``{acted/<method>: 1.0 or 0.0}`` for the
        mechanisms it measured, and counts it as undefined for the others."""
        means = {key: sum(values) / len(values) for key, values in self._this_step.items()}
        self._closed = self._closed + 1 if step is None else step
        self._this_step, logged = {}, {}
        for m in self.mechanisms:
            if (acted := m.acted_on(means)) is not None:
                self._counts[m.method][0] += 1
                self._counts[m.method][1] += acted
                logged[m.metric] = float(acted)
            else:
                undefined = self._undefined[m.method]
                undefined[0] += 1
                undefined[1] = [*undefined[1], self._closed][:SHOWN_UNDEFINED_STEPS]
        return logged

    def report(
        self, method: str, advantage_estimator: str, no_signal: tuple[int, int] | None = None
    ) -> MechanismReport:
        outcomes = []
        for m in self.mechanisms:
            found = [(item, self._values[item.key]) for item in m.observed if self._values.get(item.key)]
            observed = {item.label: (v[0], v[1]) if item.stat == "range" else v[2] / v[3] for item, v in found}
            undefined, first = self._undefined[m.method]
            outcomes.append(MechanismOutcome(m, *self._counts[m.method], observed=observed, undefined=undefined,
                                             undefined_steps=tuple(first)))  # fmt: skip
        return MechanismReport(method, advantage_estimator, outcomes, no_signal)
