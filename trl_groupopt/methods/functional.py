"""A method in one function: :func:`register_objective` turns a policy objective, and :func:`register_estimator` an
advantage estimator, into a registered method or estimator with everything a shipped one has (docs/adding-a-method.md,
"One function"). TRL-free: registering stores the function and names the generated classes by import path; the
trainer and config classes are built on first use (`trl_groupopt/trainer/functional.py`)."""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .mechanism import Mechanism
from .spec import MethodSpec, Paper

__all__ = ["FUNCTION_OBJECTIVES", "FunctionObjective", "class_prefix", "register_estimator", "register_objective"]

#: The module that builds the classes of a function objective (`<Prefix>Trainer`, `<Prefix>Config`) on first use.
CLASSES_MODULE = "trl_groupopt.trainer.functional"
#: The positional parameters every objective takes (`trl_groupopt.core.common.ObjectiveFn`).
OBJECTIVE_PARAMETERS = ("per_token_logps", "old_per_token_logps", "advantages", "mask")
#: What an estimator function may take besides its knobs, by parameter name.
ESTIMATOR_INPUTS = ("rewards", "groups", "mask", "energy")


def class_prefix(name: str) -> str:
    """The class-name stem of a registry name: its first word upper-cased (method names are mostly acronyms), the
    others capitalised: ``sapo_like`` -> ``SAPOLike`` (`SAPOLikeTrainer`, `SAPOLikeConfig`), ``grpo_fix`` -> ``GRPOFix``."""
    first, *rest = name.split("_")
    return first.upper() + "".join(word.capitalize() for word in rest)


@dataclass(frozen=True)
class FunctionObjective:
    """A registered function objective: the function, its knobs (config field -> default) and their check."""

    name: str
    function: Callable[..., Any]
    knobs: Mapping[str, Any]
    check: Callable[..., None] | None = None  # called with the knobs as keywords; raises ValueError
    needs_whole_groups: bool = False  # the function takes `groups` (a `trl_groupopt.core.common.Groups`)

    def validate(self, values: Mapping[str, Any]) -> None:
        """Raise a ValueError naming the knob unless `values` pass the check (default: finite numbers)."""
        _validate(self.name, values, self.check)


#: The registered function objectives, registry name -> :class:`FunctionObjective`.
FUNCTION_OBJECTIVES: dict[str, FunctionObjective] = {}


def _validate(name: str, values: Mapping[str, Any], check: Callable[..., None] | None) -> None:
    if check is not None:
        check(**values)
        return
    for knob, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(
                f"{knob} must be a finite number for {name!r}, got {value!r} (register it with check=... to accept "
                "other values)."
            )


def _check_signature(function: Callable[..., Any], allowed: tuple[str, ...], knobs: Mapping[str, Any],
                     what: str) -> list[str]:  # fmt: skip
    """The non-knob parameters of `function`, checked: each in `allowed`, every knob a keyword parameter."""
    parameters = inspect.signature(function).parameters
    missing = [knob for knob in knobs if knob not in parameters]
    if missing:
        raise TypeError(f"{what} {function.__qualname__} has no parameter for the knob(s) {missing}: add them as "
                        "keyword-only parameters.")  # fmt: skip
    given = [p for p in parameters if p not in knobs]
    unknown = [p for p in given if p not in allowed]
    if unknown:
        raise TypeError(f"{what} {function.__qualname__} takes {unknown}, which are neither knobs nor one of {allowed}: "
                        "declare them in knobs={...}.")  # fmt: skip
    return given


def register_objective(name: str, *, knobs: Mapping[str, Any] | None = None, summary: str = "",
                       paper: Paper | None = None, check: Callable[..., None] | None = None,
                       needs_whole_groups: bool = False, mechanism: Mechanism | None = None,
                       headline_metric: str = "entropy", on_policy_equals: str | None = None,
                       demo_defaults: Mapping[str, Any] | None = None) -> Callable[[Callable], Callable]:  # fmt: skip
    """Register a policy objective ``fn(per_token_logps, old_per_token_logps, advantages, mask, *, <knobs>)`` (and
    ``groups`` with `needs_whole_groups`) returning a (B, T) or (B, 1) per-token loss or an `ObjectiveOutput`, as
    method `name`: ``trl_groupopt.trainer_class(name)`` / ``config_class(name)`` (`<Prefix>Trainer` / `<Prefix>Config`,
    :func:`class_prefix`), ``--method name`` and ``compare``. `knobs` (name -> default) become config fields and
    ``--<knob>`` options, validated as finite numbers unless `check(**knobs)` is given (raise ValueError).
    `headline_metric`: the metric the progress line shows. The function is returned unchanged."""
    knobs = dict(knobs or {})

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        # here, not at the top: the registry imports the entry points' modules, which import this one
        from .registry import METHODS

        allowed = OBJECTIVE_PARAMETERS + (("groups",) if needs_whole_groups else ())
        given = _check_signature(function, allowed, knobs, "objective")
        if tuple(given[:4]) != OBJECTIVE_PARAMETERS or (needs_whole_groups and "groups" not in given):
            raise TypeError(f"objective {function.__qualname__} must take {OBJECTIVE_PARAMETERS} first"
                            f"{' and a groups keyword (needs_whole_groups=True)' if needs_whole_groups else ''}.")  # fmt: skip
        _validate(name, knobs, check)
        prefix = f"{CLASSES_MODULE}:{class_prefix(name)}"
        spec = MethodSpec(name, f"{prefix}Trainer", config_class=f"{prefix}Config", summary=summary,
                          paper=paper or _unpublished(name, summary, function),
                          headline_metric=headline_metric, mechanism=mechanism, on_policy_equals=on_policy_equals,
                          demo_defaults=dict(demo_defaults or {}))  # fmt: skip
        METHODS.register(name, spec)  # a taken name fails here, before anything else is stored
        FUNCTION_OBJECTIVES[name] = FunctionObjective(name, function, knobs, check, needs_whole_groups)
        return function

    return register


def _unpublished(name: str, summary: str, function: Callable[..., Any]) -> Paper:
    """The card's citation of an objective registered without a paper: the function where it is defined."""
    title = f"{name}: {summary}" if summary else name
    where = f"{function.__module__}.{function.__qualname__}".replace("_", r"\_")
    bibtex = f"@misc{{{name},\n    title = {{{{{title}}}}},\n    note  = {{objective {where}, registered with trl-groupopt}},\n}}"
    return Paper(title, bibtex)


@dataclass(frozen=True)
class _EstimatorFunction:
    """The `estimate` of a function estimator: its inputs from `EstimatorInputs`, by parameter name."""

    function: Callable[..., Any]
    inputs: tuple[str, ...]

    def __call__(self, inputs: Any, **knobs: Any) -> Any:
        from ..core.estimators import EstimatorOutput

        given = {"rewards": inputs.rewards, "mask": inputs.mask, "energy": inputs.energy}
        given["groups"] = inputs.groups() if "groups" in self.inputs else None
        out = self.function(**{name: given[name] for name in self.inputs}, **knobs)
        return out if isinstance(out, EstimatorOutput) else EstimatorOutput(out.detach())


def register_estimator(name: str, *, knobs: Mapping[str, Any] | None = None, summary: str = "",
                       check: Callable[..., None] | None = None, per_token: bool = False,
                       ) -> Callable[[Callable], Callable]:  # fmt: skip
    """Register an advantage estimator ``fn(rewards, groups, *, <knobs>)`` -> (B,) advantages (or (B, T) with
    `per_token`, or an `EstimatorOutput`), selectable as ``advantage_estimator=name`` by every method config. Its
    parameters say what it reads: ``rewards`` (B,) the weighted raw rewards (NaN: unscored), ``groups`` the group
    layout (`trl_groupopt.core.common.Groups`; micro-batches then hold whole groups), ``mask`` (B, T) the loss mask,
    ``energy`` (B, T) the rollout's logit-gradient energy. `knobs`, named ``<name>_...``, become fields of every
    method config, validated as :func:`register_objective`'s. Register before the trainers are imported (the configs' fields are fixed then).
    The function is returned unchanged."""
    knobs = dict(knobs or {})

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        from ..core.estimators import AdvantageEstimator
        from ..core.estimators import register_estimator as add

        inputs = tuple(_check_signature(function, ESTIMATOR_INPUTS, knobs, "estimator"))
        _validate(name, knobs, check)
        unprefixed = [knob for knob in knobs if not knob.startswith(f"{name}_")]
        if unprefixed:  # every method config gets them: a bare name could shadow a TRL setting (`beta`)
            raise ValueError(f"estimator {name!r}: name its knobs {name}_... (every method config gets them), got "
                             f"{unprefixed}.")  # fmt: skip
        if knobs and "trl_groupopt.trainer.config" in sys.modules:
            raise RuntimeError(f"register estimator {name!r} before importing trl_groupopt's trainers or configs: "
                               f"its knobs {list(knobs)} must be fields of the method configs, built at that import.")  # fmt: skip
        fields = tuple((knob, type(default), field(default=default, metadata={
            "help": f"advantage_estimator={name!r}: {knob} (default {default!r})."})) for knob, default in knobs.items())  # fmt: skip
        add(AdvantageEstimator(name, _EstimatorFunction(function, inputs), summary or name,
                               knobs=tuple(knobs), config_fields=fields,
                               validate=lambda **values: _validate(name, values, check),
                               needs_raw_rewards="rewards" in inputs, needs_whole_groups="groups" in inputs,
                               needs_energy="energy" in inputs, per_token=per_token))  # fmt: skip
        return function

    return register
