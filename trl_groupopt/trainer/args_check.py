"""The generic options every trainer checks, a plain `GRPOConfig` included: one table (:data:`RULES`), one fix per
option. A bad value is one `ValueError` line naming the option and the fix, before any model loads, instead of a
`ZeroDivisionError` (`num_generations=0`), a 60-line traceback at the first generation (`temperature=0`,
`top_p=nan`), or a run that silently does something else (`max_steps=-5` trains by epochs, a NaN `max_grad_norm`
makes every update NaN, `reward_weights=[nan]` trains on zero advantages).

Checked three times, each as early as it can be: by the command line on the parsed options, before any dataclass is
built (`trl_groupopt.cli.script.MethodParser`); by every method config before TRL's `__post_init__`, which divides by
the batch counts (:func:`check_before_post_init`); by every trainer's `validate_args`, before `GRPOTrainer.__init__`
loads a model given by name (:func:`check_numeric_args`). Method-specific knobs are checked by their method's config."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..runfolder.resume import inexact_resume_warning

__all__ = ["RULES", "Rule", "check_before_post_init", "check_numeric_args", "option_problems"]


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _at_least(low: float, *, finite: bool = True) -> Callable[[Any], bool]:
    return lambda v: _number(v) and (math.isfinite(v) or not finite) and v >= low


def _above(low: float) -> Callable[[Any], bool]:
    return lambda v: _number(v) and math.isfinite(v) and v > low


def _within(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        return _number(v) and (v > low if open_low else v >= low) and (v < high if open_high else v <= high)

    return ok


def _integer(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= low


def _weights(v: Any) -> bool:
    values = list(v) if isinstance(v, Sequence) and not isinstance(v, str) else [v]
    return all(_number(w) and math.isfinite(w) for w in values) and any(w != 0 for w in values)


def _by_steps(strategy: str) -> Callable[[Any], bool]:
    # an IntervalStrategy / SaveStrategy enum once the config is built, the plain string before
    return lambda args: str(getattr(args, strategy, "no")).split(".")[-1].lower() == "steps"


@dataclass(frozen=True)
class Rule:
    """What a valid value is (`ok`), the fix the message gives, and when the rule applies."""

    ok: Callable[[Any], bool]
    fix: str
    optional: bool = False  # None is a valid value (unset, or TRL's "off")
    counts: bool = False  # TRL's or the schedule's `__post_init__` divides by it: checked before they run
    applies: Callable[[Any], bool] | None = None  # None: always


_CLIP = "the clip range must be a finite number >= 0, e.g. 0.2"
_INTERVAL = "it must be > 0 with {0}_strategy='steps': a number of steps, or a fraction (< 1) of the run"

#: option -> its rule: the one table of the generic options (method knobs: their method's config).
RULES: dict[str, Rule] = {
    "num_iterations": Rule(
        _integer(1), "it must be an integer >= 1 (optimizer passes per generated batch); use 1 for on-policy training"
    ),
    "max_steps": Rule(
        lambda v: _integer(0)(v) or v == -1, "use a positive number of steps, or -1 to train by num_train_epochs"
    ),
    "beta": Rule(_at_least(0), "the KL penalty's weight must be a finite number >= 0; use 0 to turn it off"),
    "max_grad_norm": Rule(_at_least(0), "it must be a finite number >= 0; use 0 to turn clipping off"),
    "epsilon": Rule(_at_least(0), _CLIP),
    "epsilon_high": Rule(_at_least(0), _CLIP, optional=True),
    "learning_rate": Rule(_at_least(0), "it must be a finite number >= 0, e.g. 1e-6"),
    "weight_decay": Rule(_at_least(0), "it must be a finite number >= 0; use 0 to turn weight decay off"),
    "adam_beta1": Rule(_within(0, 1, open_high=True), "AdamW's beta1 must be within [0, 1), e.g. 0.9"),
    "adam_beta2": Rule(_within(0, 1, open_high=True), "AdamW's beta2 must be within [0, 1), e.g. 0.999"),
    "adam_epsilon": Rule(_above(0), "it must be a finite number > 0, e.g. 1e-8"),
    "temperature": Rule(
        _above(0), "the sampling temperature must be a finite number > 0, e.g. 1.0 (lower: less random completions)"
    ),
    "max_completion_length": Rule(
        _integer(1),
        "the most tokens a completion may have: it must be an integer >= 1, e.g. 256, or unset (None) to take it "
        "from the model's config",
        optional=True,
    ),
    "top_p": Rule(_within(0, 1, open_low=True), "it must be within (0, 1]; 1.0 keeps every token"),
    "top_k": Rule(_integer(0), "it must be an integer >= 0; 0 keeps every token", optional=True),
    "min_p": Rule(_within(0, 1), "it must be within [0, 1], or unset (None) to turn it off", optional=True),
    "repetition_penalty": Rule(_above(0), "it must be a finite number > 0; 1.0 applies no penalty"),
    "top_entropy_quantile": Rule(
        _within(0, 1),
        "it must be within [0, 1]: the share of the highest-entropy tokens the policy loss keeps (1.0: every token)",
    ),
    "scale_rewards": Rule(
        lambda v: v in ("group", "batch", "none") or v is True or v is False, "it must be 'group', 'batch' or 'none'"
    ),
    "reward_weights": Rule(
        _weights,
        "every weight must be a finite number, one per reward function, and one at "
        "least non-zero (all zero: no learning signal); 0 turns one function off",
        optional=True,
    ),
    "per_device_train_batch_size": Rule(_integer(1), "it must be an integer >= 1", counts=True),
    "gradient_accumulation_steps": Rule(_integer(1), "it must be an integer >= 1", counts=True),
    "num_generations": Rule(  # >= 1 here: TRL's own message refuses 1; 0 would divide by zero before it
        _integer(1),
        "completions per prompt: it must be an integer >= 2 (a group's completions are compared), e.g. 8",
        counts=True,
    ),
    "steps_per_generation": Rule(_integer(1), "it must be an integer >= 1, or unset", optional=True, counts=True),
    "generation_batch_size": Rule(_integer(1), "it must be an integer >= 1, or unset", optional=True, counts=True),
    "save_steps": Rule(
        _above(0), _INTERVAL.format("save") + "; save_strategy='no' saves none", applies=_by_steps("save_strategy")
    ),
    "logging_steps": Rule(_above(0), _INTERVAL.format("logging"), applies=_by_steps("logging_strategy")),
}


def option_problems(args: Any, *, unset_ok: bool = False, counts_only: bool = False) -> list[tuple[str, Any, str]]:
    """``[(option, value, fix)]`` for the values of `args` (a config, or the parsed command line) that break
    :data:`RULES`. `unset_ok`: None means "not resolved yet" (before `__post_init__`) and passes."""
    problems = []
    for name, rule in RULES.items():
        if (counts_only and not rule.counts) or not hasattr(args, name):
            continue
        value = getattr(args, name)
        if value is None and (rule.optional or unset_ok):
            continue
        if (rule.applies is None or rule.applies(args)) and not rule.ok(value):
            problems.append((name, value, rule.fix))
    return problems


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def format_problems(owner: str, problems: list[tuple[str, Any, str]]) -> str:
    """``Owner: option=value: fix; ...`` (one line)."""
    return f"{owner}: " + "; ".join(f"{name}={_shown(value)}: {fix}" for name, value, fix in problems) + "."


def check_before_post_init(owner: str, args: Any) -> None:
    """The batch counts of a config being built, before TRL's `__post_init__` divides by them."""
    problems = option_problems(args, unset_ok=True, counts_only=True)
    if problems:
        raise ValueError(format_problems(owner, problems))


def check_numeric_args(trainer_name: str, args: Any) -> None:
    """Raise on the values :data:`RULES` refuses; warn on a `save_steps` that makes a resume inexact."""
    problems = option_problems(args)
    if problems:
        raise ValueError(format_problems(trainer_name, problems))
    max_steps, save_steps = args.max_steps, getattr(args, "save_steps", None)
    if _number(save_steps) and max_steps > 0 and save_steps >= max_steps:
        return  # no checkpoint inside the run: only the final one, which a resume does not continue
    inexact = inexact_resume_warning(args)
    if inexact is not None:
        warnings.warn(inexact, UserWarning, stacklevel=3)
