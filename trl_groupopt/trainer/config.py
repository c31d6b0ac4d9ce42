"""What every method config shares: `TokenSafeConfigMixin` (token safety, bf16 by device, the no-reward cap, the
non-finite guard) and `AdvantageEstimatorConfigMixin` (the advantage estimator and its knobs)."""

from __future__ import annotations

import copyreg
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Any

from transformers import TrainingArguments

from ..core.estimators import DEFAULT_ESTIMATOR, ESTIMATORS, estimator_of
from ..data.checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
from ..methods.registry import load_estimators
from .args_check import check_before_post_init
from .device import device_supports_bf16

_WITHHOLD_TOKENS: ContextVar[bool] = ContextVar("trl_groupopt_withhold_tokens", default=False)


def _reduce_training_arguments(args: TrainingArguments) -> tuple:
    """`copyreg` reducer of every `TrainingArguments` class: the default reduction, less the tokens when withheld."""
    reduced = list(object.__reduce_ex__(args, 2))  # (copyreg.__newobj__, (cls,), state, ...), as pickle would
    state = reduced[2]
    if _WITHHOLD_TOKENS.get() and isinstance(state, dict):
        reduced[2] = {key: (None if key.endswith("_token") else value) for key, value in state.items()}
    return tuple(reduced)


@contextmanager
def tokens_withheld() -> Iterator[None]:
    """Within it, every `TrainingArguments` pickles without its `*_token` fields (what the trainer writes to disk and
    uploads); elsewhere (`copy.deepcopy`, pickling to another process) the token is kept. It patches the
    process-wide `copyreg.dispatch_table`: on entering, it registers `_reduce_training_arguments` for every
    `TrainingArguments` class defined so far, for good (never removed; outside this block the reducer pickles as
    pickle would, so only the token-dropping is scoped)."""
    # For every config class so far: `copyreg`'s table is looked up by exact class, so a plain `GRPOConfig` (the
    # baseline method) would write its token to disk.
    pending = [TrainingArguments]
    while pending:
        cls = pending.pop()
        copyreg.dispatch_table.setdefault(cls, _reduce_training_arguments)
        pending.extend(cls.__subclasses__())
    reset = _WITHHOLD_TOKENS.set(True)
    try:
        yield
    finally:
        _WITHHOLD_TOKENS.reset(reset)


@dataclass(repr=False)
class TokenSafeConfigMixin:
    """Mixed into every method config, first: `repr()` redacts the tokens, `bf16` is picked by device."""

    max_all_none_reward_batches: int = field(
        default=DEFAULT_MAX_ALL_NONE_REWARD_BATCHES,
        metadata={
            "help": "Stop training after this many consecutive generation batches in which every reward function "
            "returned None for every completion (each such batch warns, naming the functions and the columns)."
        },
    )

    nonfinite_guard: bool = field(
        default=True,
        metadata={
            "help": "Stop training with an error naming the step at the first NaN/inf loss or gradient norm, before "
            "the optimizer applies it, and refuse to save or push weights holding NaN/inf. False: transformers' "
            "behaviour (training goes on)."
        },
    )

    def __post_init__(self):
        check_before_post_init(type(self).__name__, self)  # the batch counts TRL's `__post_init__` divides by
        # TRL's `_BaseConfig.__post_init__` turns an unset bf16 into True, which transformers then rejects on a
        # CPU-only machine ("Your setup doesn't support bf16/gpu"). Decide first: bf16 only where the device has it.
        if self.bf16 is None:
            self.bf16 = not self.fp16 and device_supports_bf16(self.use_cpu)
        # TRL's default `gradient_checkpointing=True` is a deprecated alias in transformers 5 and warns on every
        # config; resolve it to `activation_checkpointing` as `TrainingArguments.__post_init__` would, silently.
        if getattr(self, "activation_checkpointing", False) is None and self.gradient_checkpointing is not None:
            self.activation_checkpointing = self.gradient_checkpointing
        if self.max_all_none_reward_batches < 1:
            raise ValueError(f"max_all_none_reward_batches must be >= 1, got {self.max_all_none_reward_batches}.")
        super().__post_init__()

    def __repr__(self) -> str:
        return str(self)


class _EstimatorChecks:
    def __post_init__(self):
        # Checked before TRL's own post-init: a bad value fails at once, naming the field and the fix.
        try:
            selected = estimator_of(self)
            if selected.validate is not None:
                selected.validate(**{knob: getattr(self, knob) for knob in selected.knobs})
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None
        # A knob of an estimator other than the selected one would silently do nothing.
        defaults = {f.name: f.default for f in fields(self) if f.default is not MISSING}
        for estimator in ESTIMATORS.values():
            changed = [knob for knob in estimator.knobs if knob in defaults and getattr(self, knob) != defaults[knob]]
            if changed and estimator is not selected:
                raise ValueError(
                    f"{type(self).__name__}: {', '.join(changed)} set, but advantage_estimator={selected.name!r} "
                    f"does not read it: set advantage_estimator={estimator.name!r}, or leave it unset."
                )
        super().__post_init__()


def _estimator_fields() -> list[tuple[str, Any, Any]]:
    load_estimators()
    choices = "; ".join(f"{name!r}: {estimator.summary}" for name, estimator in ESTIMATORS.items())
    selector = field(
        default=DEFAULT_ESTIMATOR,
        metadata={"help": f"Advantages the objective receives: {choices}.", "choices": list(ESTIMATORS)},
    )
    return [("advantage_estimator", str, selector), *(f for e in ESTIMATORS.values() for f in e.config_fields)]


#: Mixed into every method config (before `GRPOConfig`): `advantage_estimator` and the knobs of every estimator
#: registered when this module is imported (`AdvantageEstimator.config_fields`).
AdvantageEstimatorConfigMixin = make_dataclass(
    "AdvantageEstimatorConfigMixin", _estimator_fields(), bases=(_EstimatorChecks,), repr=False
)
AdvantageEstimatorConfigMixin.__module__ = __name__
