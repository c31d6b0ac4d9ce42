"""What every method config shares: `TokenSafeConfigMixin` (token safety, bf16 by device, the no-reward cap, the
non-finite guard), and `objective_arguments`, the one binding of an objective's hyper-parameters to the config fields
that set them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
from ..device import device_supports_bf16

__all__ = ["TokenSafeConfigMixin", "objective_arguments", "tokens_withheld"]

_WITHHOLD_TOKENS: ContextVar[bool] = ContextVar("trl_groupopt_withhold_tokens", default=False)


@contextmanager
def tokens_withheld() -> Iterator[None]:
    """Within it, a method config pickles without its `*_token` fields: what `GroupOptTrainer` writes to disk
    (`training_args.bin` in checkpoints and the output folder) and uploads. Elsewhere (`copy.deepcopy`, pickling in
    memory, e.g. to another process) the token is kept."""
    reset = _WITHHOLD_TOKENS.set(True)
    try:
        yield
    finally:
        _WITHHOLD_TOKENS.reset(reset)


def objective_arguments(config: Any, fields: Mapping[str, str]) -> dict[str, Any]:
    """`{objective argument: config value}` for `fields`, which maps each argument to the config field that sets it.

    The config validates its values with the objective's `validate_<method>(**objective_arguments(...),
    names=fields)` (so errors name the config's fields) and the trainer calls the objective with the same binding.
    An unset `epsilon_high` reads as `epsilon`, as `GRPOTrainer` reads it.
    """
    values = {argument: getattr(config, name) for argument, name in fields.items()}
    if fields.get("epsilon_high") == "epsilon_high" and values["epsilon_high"] is None:
        values["epsilon_high"] = config.epsilon  # mirrors GRPOTrainer.__init__ (trl 1.16.0): `self.epsilon_high`
    return values


@dataclass(repr=False)
class TokenSafeConfigMixin:
    """Mixed into every method config (put it first, and use `@dataclass(repr=False)`).

    transformers pickles the whole config into every checkpoint and `output_dir` as `training_args.bin`, which
    `push_to_hub` uploads, and `@dataclass` regenerates a field-by-field `__repr__` that shows `hub_token`. Pickled
    under `tokens_withheld()` (the trainer's saves and uploads) the state drops every `*_token` field, and `repr()` is
    the redacting `str()` of `TrainingArguments`; the live object, its deep copies and in-memory pickles keep the token
    for pushing.

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

    def __getstate__(self) -> dict[str, Any]:
        if not _WITHHOLD_TOKENS.get():
            return dict(self.__dict__)
        return {key: (None if key.endswith("_token") else value) for key, value in self.__dict__.items()}
