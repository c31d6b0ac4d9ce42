"""What every method config shares: `TokenSafeConfigMixin` (token safety, bf16 by device, the no-reward cap, the
non-finite guard) and `AdvantageEstimatorConfigMixin` (which advantages the objective receives, and the estimators'
knobs). A method config binds its fields to its objective's arguments with `objectives.common.config_arguments`."""

from __future__ import annotations

import copyreg
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from transformers import TrainingArguments

from ..checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
from ..device import device_supports_bf16
from ..objectives.estimators import DEFAULT_ESTIMATOR, ESTIMATORS, AdvantageEstimator, estimator_of
from ..objectives.otb import TOKEN_POSITIONS

__all__ = [
    "AdvantageEstimatorConfigMixin",
    "TokenSafeConfigMixin",
    "estimator_knobs",
    "tokens_withheld",
]

_WITHHOLD_TOKENS: ContextVar[bool] = ContextVar("trl_groupopt_withhold_tokens", default=False)


def _without_tokens(state: Any) -> Any:
    if not (_WITHHOLD_TOKENS.get() and isinstance(state, dict)):
        return state
    return {key: (None if key.endswith("_token") else value) for key, value in state.items()}


def _reduce_training_arguments(args: TrainingArguments) -> tuple:
    """`copyreg` reducer of every `TrainingArguments` class: the default reduction, with the state's `*_token` fields
    set to None under `tokens_withheld()` (unchanged elsewhere, so copies and in-memory pickles keep the token)."""
    reduced = list(object.__reduce_ex__(args, 2))  # (copyreg.__newobj__, (cls,), state, ...), as pickle would
    reduced[2] = _without_tokens(reduced[2])
    return tuple(reduced)


def _withhold_for_every_config_class() -> None:
    """Register the reducer for `TrainingArguments` and every subclass defined so far (TRL's plain `GRPOConfig`, a
    user's own config): `copyreg`'s table is looked up by exact class, and a plain `GRPOConfig` has no
    `TokenSafeConfigMixin.__getstate__`, so without it the baseline method wrote its token to disk."""
    classes, pending = set(), [TrainingArguments]
    while pending:
        cls = pending.pop()
        if cls not in classes:
            classes.add(cls)
            pending.extend(cls.__subclasses__())
    for cls in classes:
        copyreg.dispatch_table.setdefault(cls, _reduce_training_arguments)


@contextmanager
def tokens_withheld() -> Iterator[None]:
    """Within it, every training config (any `TrainingArguments`, e.g. TRL's plain `GRPOConfig`, not only the method
    configs) pickles without its `*_token` fields: what `GroupOptTrainer` writes to disk (`training_args.bin` in
    checkpoints and the output folder) and uploads. Elsewhere (`copy.deepcopy`, pickling in memory, e.g. to another
    process) the token is kept."""
    _withhold_for_every_config_class()
    reset = _WITHHOLD_TOKENS.set(True)
    try:
        yield
    finally:
        _WITHHOLD_TOKENS.reset(reset)


@dataclass(repr=False)
class TokenSafeConfigMixin:
    """Mixed into every method config (put it first, and use `@dataclass(repr=False)`).

    transformers pickles the whole config into every checkpoint and `output_dir` as `training_args.bin`, which
    `push_to_hub` uploads, and `@dataclass` regenerates a field-by-field `__repr__` that shows `hub_token`. Pickled
    under `tokens_withheld()` (the trainer's saves and uploads; it covers every `TrainingArguments` class) the state
    drops every `*_token` field, and `repr()` is the redacting `str()` of `TrainingArguments`; the live object, its
    deep copies and in-memory pickles keep the token for pushing.

    It also picks `bf16` for the device when the user leaves it unset (see `__post_init__`) and adds
    `max_all_none_reward_batches` and `nonfinite_guard` (both read with a default, so plain `GRPOConfig`s work too).
    """

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


def estimator_knobs(config: Any, estimator: AdvantageEstimator) -> dict[str, Any]:
    """`{knob: value}` of `estimator`'s knobs in `config`, the keywords its `estimate` and `validate` take."""
    missing = [knob for knob in estimator.knobs if not hasattr(config, knob)]
    if missing:
        raise ValueError(
            f"advantage_estimator={estimator.name!r} reads {missing}, which {type(config).__name__} does not have: "
            "use a config with AdvantageEstimatorConfigMixin (every trl-groupopt method config)."
        )
    return {knob: getattr(config, knob) for knob in estimator.knobs}


@dataclass(repr=False)
class AdvantageEstimatorConfigMixin:
    """Mixed into every method config (before the `GRPOConfig` base, with `@dataclass(repr=False)`): the advantage
    estimator the policy objective receives its advantages from, and the estimators' knobs.

    The estimators and what each needs are in `trl_groupopt/objectives/estimators.py`; what each combination with a
    method's objective means is on the method's page (docs/echo.md, docs/ctpo.md, docs/dfpo.md, docs/otb.md).

    Parameters:
        advantage_estimator (`str`, *optional*, defaults to `"grpo"`):
            `"grpo"`: TRL's group-normalised advantages, exactly as `GRPOTrainer` computes them. `"otb"`: the optimal
            token baseline (arXiv:2602.07078): per-token advantages `A_it = G_i - b_t` on the raw rewards (no
            std normalisation: `scale_rewards` then only changes TRL's logged `advantages`), `b_t` weighted by the
            logit-gradient energy the trainer reads from its fused LM head; it needs whole groups in every
            micro-batch and logs `otb/*` metrics (docs/otb.md).
        otb_token_positions (`str`, *optional*, defaults to `"valid"`):
            (`"otb"` only.) What the position `t` of the baseline `b_t` counts when the loss mask has holes (tool
            results under TRL's `tool_mask`). `"valid"`: each row's valid tokens are compacted first, so `b_t`
            compares the t-th *generated* token of every member, as verl's tool-use estimator does; `"absolute"`: the
            column index, as verl's single-turn estimator. Identical when no mask has holes (single-turn), so
            `"valid"` is the default: it is the single-turn estimator there and the tool-use one under a `tool_mask`,
            where comparing a member's generated token with another member's tool output would make no sense.
        otb_handle_zero_tail (`bool` or `None`, *optional*, defaults to `None`):
            (`"otb"` only.) Zero the baseline of a group's unique longest member past the second-longest valid-token
            count, where it would otherwise be compared with itself (`b_t ~ G_i`, no learning signal on its tail).
            `None` follows verl's defaults per estimator: on for batches with a `tool_mask` (verl's tool-use
            estimator defaults it to True), off otherwise (verl's single-turn estimator defaults it to False).
            `True` / `False` force it.
    """

    advantage_estimator: str = field(
        default=DEFAULT_ESTIMATOR,
        metadata={
            "help": "Advantages the objective receives: 'grpo' (TRL's group-normalised) or 'otb' (optimal token "
            "baseline, per token, raw rewards).",
            "choices": list(ESTIMATORS),
        },
    )
    otb_token_positions: str = field(
        default="valid",
        metadata={
            "help": "advantage_estimator='otb': position index of the baseline under a tool mask: 'valid' (k-th "
            "generated token, verl's tool-use estimator) or 'absolute' (column index, verl's single-turn estimator). "
            "Identical without holes.",
            "choices": list(TOKEN_POSITIONS),
        },
    )
    otb_handle_zero_tail: bool | None = field(
        default=None,
        metadata={
            "help": "advantage_estimator='otb': baseline 0 on a group's unique longest completion past the "
            "second-longest. Default (unset): on for tool-use batches (tool_mask), off otherwise, as verl's two "
            "estimators."
        },
    )

    def __post_init__(self):
        # Checked before TRL's own post-init: a bad value fails at once, naming the field and the fix.
        name = type(self).__name__
        try:
            estimator = estimator_of(self)
            if estimator.validate is not None:
                estimator.validate(**estimator_knobs(self, estimator))
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        self._check_no_unused_estimator_knobs(estimator)
        super().__post_init__()

    def _check_no_unused_estimator_knobs(self, selected: AdvantageEstimator) -> None:
        """Raise when a knob of an estimator other than the selected one is set: it would silently do nothing."""
        defaults = {f.name: f.default for f in fields(self) if f.default is not MISSING}
        for estimator in ESTIMATORS.values():
            if estimator is selected:
                continue
            changed = [knob for knob in estimator.knobs if knob in defaults and getattr(self, knob) != defaults[knob]]
            if changed:
                raise ValueError(
                    f"{type(self).__name__}: {', '.join(changed)} set, but advantage_estimator={selected.name!r} "
                    f"does not read it: set advantage_estimator={estimator.name!r}, or leave it unset."
                )
