"""Checks of the training data and the reward functions, run before anything expensive happens.

Each failure raises at the door (trainer construction, or the first reward batch) with a message that names the
fix, instead of a bare ``KeyError`` or ``TypeError`` from deep inside TRL after the model has loaded:

- :func:`check_train_dataset`: the ``prompt`` column exists and is standard (a string) or conversational (a list of
  ``{"role", "content"}`` messages); each reward function's required parameters are dataset columns (read from its
  signature) and it accepts the keyword arguments GRPOTrainer passes.
- :func:`checked_reward_func`: wraps a reward function so that a return value GRPOTrainer could not read as one
  number (or None) per completion fails with the function's name.
- :func:`check_finite_rewards`: an infinite reward fails at its first batch, naming the function and the completion.
- :class:`AllNoneRewardWatch`: warns when a whole generation batch got no reward (every function returned None or NaN
  for every completion) and, with a limit (the method configs and the CLI), raises after ``limit`` such batches in a
  row.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from trl.trainer.utils import get_callable_name, is_async_callable

__all__ = [
    "DEFAULT_MAX_ALL_NONE_REWARD_BATCHES",
    "TRL_REWARD_KWARGS",
    "AllNoneRewardWatch",
    "CheckedRewardFunc",
    "all_none_limit",
    "check_finite_rewards",
    "check_reward_output",
    "check_train_dataset",
    "checked_reward_func",
    "checked_reward_funcs",
    "prepare_trainer_inputs",
    "watch_all_none_rewards",
]

#: Keyword arguments GRPOTrainer passes to every reward function besides the dataset columns
#: (``GRPOTrainer._calculate_rewards``; ``environments`` only with an ``environment_factory``).
TRL_REWARD_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
#: Dataset columns GRPOTrainer does not forward to reward functions (they arrive as ``prompts``/``completions``).
_NOT_FORWARDED = ("prompt", "completion", "completion_ids")
#: Consecutive generation batches with no reward at all before training stops.
DEFAULT_MAX_ALL_NONE_REWARD_BATCHES = 2


def _column_names(dataset: Any) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    if names is None and getattr(dataset, "features", None) is not None:  # IterableDataset with known features
        names = list(dataset.features)
    if isinstance(names, dict):  # a DatasetDict: the caller passed the whole dict, not a split
        raise ValueError(
            f"train_dataset is a DatasetDict with splits {sorted(names)}; pass one split, e.g. dataset['train']."
        )
    return None if names is None else list(names)


def _check_prompt_format(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
        missing = [i for i, m in enumerate(prompt) if "role" not in m or "content" not in m]
        if not missing:
            return
        raise ValueError(
            f"train_dataset's 'prompt' looks conversational but message {missing[0]} has keys "
            f"{sorted(prompt[missing[0]])}: each message needs 'role' and 'content', e.g. "
            '[{"role": "user", "content": "What is 2+2?"}].'
        )
    raise ValueError(
        f"train_dataset's 'prompt' must be a string (standard format) or a list of {{'role', 'content'}} messages "
        f"(conversational format), got {type(prompt).__name__}: {str(prompt)[:80]!r}."
    )


def _check_reward_signature(func: Callable, columns: list[str] | None, has_environments: bool) -> None:
    """The reward function can be called with what GRPOTrainer passes: its required parameters are present."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins, C callables: nothing to read
        return
    params = signature.parameters.values()
    takes_var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    supplied = set(TRL_REWARD_KWARGS) | ({"environments"} if has_environments else set())
    if columns is not None:
        supplied |= {c for c in columns if c not in _NOT_FORWARDED}
    name = get_callable_name(func)
    for p in params:
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty:
            raise ValueError(
                f"Reward function {name!r} has a positional-only parameter {p.name!r}: GRPOTrainer calls reward "
                "functions with keyword arguments only (completions=..., prompts=..., <column>=...)."
            )
        required = p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        if required and p.name not in supplied and columns is not None:
            hint = (
                " GRPOTrainer passes the prompt as `prompts` (plural), not as a column."
                if p.name in _NOT_FORWARDED
                else f" Add a {p.name!r} column to the dataset (e.g. dataset.map or rename_column), or give the "
                "parameter a default."
            )
            raise ValueError(
                f"Reward function {name!r} needs the argument {p.name!r}, which the training data does not provide: "
                f"train_dataset has columns {columns}, and GRPOTrainer also passes {sorted(TRL_REWARD_KWARGS)}.{hint}"
            )
    if not takes_var_kwargs and columns is not None:
        accepted = {p.name for p in params}
        extra = sorted(supplied - accepted)
        if extra:
            raise ValueError(
                f"Reward function {name!r} does not accept **kwargs, but GRPOTrainer passes it every dataset column "
                f"and its own arguments as keywords; it would fail on {extra}. Add **kwargs to its signature: "
                f"def {name}(completions, **kwargs)."
            )


def check_train_dataset(train_dataset: Any, reward_funcs: Any = None, *, has_environments: bool = False) -> None:
    """Raise a ``ValueError`` naming the fix if GRPOTrainer could not train on ``train_dataset`` with ``reward_funcs``.

    Checks the ``prompt`` column and its format (first row), and for every reward function that is a Python
    callable (not a reward model or a model id) that its signature accepts what GRPOTrainer passes. ``None``
    arguments are skipped (an ``environment_factory`` may own both the data and the reward); datasets whose columns
    are unknown (streaming without features) skip the column checks. With environments the ``prompt`` column is
    optional, as in GRPOTrainer: each rollout's ``reset()`` supplies the prompt (e.g. a dataset with only the
    ``environment`` column that routes rows to a dict of environments).
    """
    columns = _column_names(train_dataset) if train_dataset is not None else None
    has_prompt = columns is not None and "prompt" in columns
    if columns is not None and not has_prompt and not has_environments:
        hint = ""
        for src, adapter in (("question", "gsm8k_to_conversational"), ("problem", "math_to_conversational")):
            if src in columns:
                hint = f" It has {src!r}: map it with trl_groupopt.adapters.{adapter} (or rename it to 'prompt')."
                break
        raise ValueError(
            f"train_dataset has no 'prompt' column (columns: {columns}). GRPOTrainer reads the prompts from 'prompt': "
            f"a string (standard format) or a list of {{'role', 'content'}} messages (conversational).{hint or ' '}"
            + ("" if hint else "Rename your prompt column with dataset.rename_column(<name>, 'prompt').")
        )
    if columns is not None and hasattr(train_dataset, "__getitem__") and hasattr(train_dataset, "__len__"):
        if len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: there is nothing to train on.")
        if has_prompt:
            _check_prompt_format(train_dataset[0]["prompt"])
    if reward_funcs is None:
        return
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    for func in funcs:
        if isinstance(func, str | torch.nn.Module) or not callable(func):
            continue
        _check_reward_signature(func, columns, has_environments)


def _reward_value_problem(value: Any) -> str | None:
    """Why GRPOTrainer could not read ``value`` as one reward, or None if it can (a number, a bool, a numpy scalar,
    a one-element 0-d tensor or array, or None)."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        return "a string"
    if isinstance(value, torch.Tensor):  # (no copy: torch.tensor(tensor) warns)
        if value.is_meta:  # it has a shape but no value: TRL's `.item()` would fail naming no function
            return "a tensor on the meta device, which holds no value: compute it on the CPU or GPU"
        return None if value.ndim == 0 else f"of shape {tuple(value.shape)}, not one number"
    try:
        converted = torch.tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return "not a number"
    return None if converted.ndim == 0 else f"of shape {tuple(converted.shape)}, not one number"


def check_reward_output(name: str, output: Any, num_expected: int | None = None) -> None:
    """Raise naming the reward function unless GRPOTrainer can read ``output`` as one reward per completion.

    Accepted is exactly what `GRPOTrainer._calculate_rewards` converts: any sized iterable (a list, a numpy array, a
    1-D tensor) of numbers, bools (numpy's too), 0-d tensors or None, which it reads with ``None -> NaN`` and
    ``torch.tensor(..., dtype=float32)``. Non-finite values are checked over the whole batch later
    (:func:`check_finite_rewards`).
    """
    if isinstance(output, str | bytes | Mapping) or not hasattr(output, "__len__") or not hasattr(output, "__iter__"):
        raise TypeError(
            f"Reward function {name!r} returned {type(output).__name__} {str(output)[:60]!r}; it must return a list "
            "with one float (or None to skip) per completion."
        )
    if isinstance(output, torch.Tensor | np.ndarray) and output.ndim != 1:
        raise TypeError(
            f"Reward function {name!r} returned a {type(output).__name__} of shape {tuple(output.shape)}; it must "
            "return one number per completion (a list, or a 1-D array or tensor)."
        )
    for i, value in enumerate(output):
        problem = _reward_value_problem(value)
        if problem is not None:
            raise TypeError(
                f"Reward function {name!r} returned {type(value).__name__} {str(value)[:60]!r} for completion {i} "
                f"({problem}); reward functions return one float (or None to skip the completion) per completion."
            )
    if num_expected is not None and len(output) != num_expected:
        raise ValueError(
            f"Reward function {name!r} returned {len(output)} rewards for {num_expected} completions: return exactly "
            "one reward per completion."
        )


def check_finite_rewards(rewards_per_func: torch.Tensor, func_names: Sequence[str]) -> None:
    """Raise naming the reward function and the completion if a reward of the (N, F) generation batch is +-inf.

    NaN is TRL's mark of an unscorable completion (a reward function returned None or NaN) and passes; an infinite
    reward (or one beyond float32's range, which TRL's float32 conversion turns into inf) would make its group's
    advantages NaN or zero without a word, in every trainer. Every reward source is checked (functions, reward
    models, environments); the matrix is gathered over processes, so every rank raises together.
    """
    infinite = torch.isinf(rewards_per_func)
    if not bool(infinite.any()):
        return
    row, column = (int(i) for i in infinite.nonzero()[0])
    name = func_names[column] if column < len(func_names) else f"#{column}"
    raise ValueError(
        f"Reward function {name!r} returned {rewards_per_func[row, column].item()} for completion {row} of the "
        f"generation batch ({int(infinite.sum())} infinite reward(s) in this batch). Rewards must be finite numbers "
        "within float32's range (|r| < 3.4e38); return None (or NaN) for a completion the function cannot score."
    )


class CheckedRewardFunc:
    """A reward function whose return value is checked (see :func:`check_reward_output`).

    A class, not a closure, so it pickles whenever the wrapped function does (TRL's picklable reward forms);
    ``__name__`` is TRL's display name of the wrapped function (TRL logs ``rewards/<name>/mean``) and
    ``__wrapped__`` makes ``inspect.signature`` read the original's signature.
    """

    def __init__(self, func: Callable):
        self.__wrapped__ = func
        self.__name__ = get_callable_name(func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self.__wrapped__(*args, **kwargs)
        completions = kwargs.get("completions")
        check_reward_output(self.__name__, output, None if completions is None else len(completions))
        return output

    def __repr__(self) -> str:
        return f"CheckedRewardFunc({self.__wrapped__!r})"


def checked_reward_func(func: Any) -> Any:
    """``func`` wrapped in :class:`CheckedRewardFunc`; async functions, reward models and model ids unchanged."""
    if isinstance(func, str | torch.nn.Module | CheckedRewardFunc) or not callable(func) or is_async_callable(func):
        return func
    return CheckedRewardFunc(func)


def checked_reward_funcs(reward_funcs: Any) -> Any:
    """:func:`checked_reward_func` over a single reward function or a list (None passes through)."""
    if reward_funcs is None:
        return None
    if isinstance(reward_funcs, list | tuple):
        return [checked_reward_func(f) for f in reward_funcs]
    return checked_reward_func(reward_funcs)


def prepare_trainer_inputs(reward_funcs: Any, train_dataset: Any, environment_factory: Any = None) -> Any:
    """The construction-time check of :class:`~trl_groupopt.trainers.base.GroupOptTrainer`: checks the data
    against the reward functions and returns the reward functions wrapped by :func:`checked_reward_funcs`."""
    check_train_dataset(train_dataset, reward_funcs, has_environments=environment_factory is not None)
    return checked_reward_funcs(reward_funcs)


class AllNoneRewardWatch:
    """Counts generation batches in which every reward function returned None (or NaN) for every completion.

    Each such batch logs a warning naming the functions and the dataset columns they received; ``limit``
    consecutive ones raise a ``RuntimeError`` (a run with no reward would otherwise "train" with zero loss and
    write checkpoints). A batch with any reward resets the count. ``limit=None`` only warns, as GRPOTrainer does.
    """

    def __init__(self, limit: int | None = DEFAULT_MAX_ALL_NONE_REWARD_BATCHES):
        if limit is not None and limit < 1:
            raise ValueError(f"max_all_none_reward_batches must be >= 1, got {limit}.")
        self.limit = limit
        self.consecutive = 0

    def update(self, rewards_per_func: torch.Tensor, func_names: Sequence[str], columns: Sequence[str]) -> None:
        """``rewards_per_func``: (N, F) rewards of one generation batch, NaN where a function returned None."""
        if rewards_per_func.numel() and not bool(torch.isnan(rewards_per_func).all()):
            self.consecutive = 0
            return
        self.consecutive += 1
        stops = "" if self.limit is None else f"; the run stops at {self.limit}"
        message = (
            f"Every reward function ({', '.join(func_names) or 'none'}) returned None or NaN for every completion of a "
            f"generation batch ({self.consecutive} such batch(es) in a row{stops}). They received the dataset "
            f"columns {sorted(columns)}. A reward function returns None (or NaN) when it cannot score a completion "
            "(e.g. an unparseable gold answer): check that the column it reads holds what it expects."
        )
        if self.limit is not None and self.consecutive >= self.limit:
            raise RuntimeError(
                message + " No reward means no learning signal, so training stops here; fix the reward functions or "
                "the data (or raise max_all_none_reward_batches)."
            )
        warnings.warn(message, UserWarning, stacklevel=3)


def all_none_limit(args: Any) -> int | None:
    """The config's ``max_all_none_reward_batches``; None (warn only, as GRPOTrainer does) for configs without it:
    TRL's plain ``GRPOConfig`` in the base trainer keeps GRPOTrainer's behaviour."""
    value = getattr(args, "max_all_none_reward_batches", None)
    return None if value is None else int(value)


def watch_all_none_rewards(trainer: Any, rewards_per_func: torch.Tensor, inputs: Sequence[dict[str, Any]]) -> None:
    """Feed one generation batch's (N, F) rewards to the trainer's :class:`AllNoneRewardWatch` (created on first
    use with the config's ``max_all_none_reward_batches``). ``rewards_per_func`` is gathered over processes, so every
    rank raises together."""
    watch = trainer.__dict__.get("_all_none_reward_watch")
    if watch is None:
        watch = trainer._all_none_reward_watch = AllNoneRewardWatch(all_none_limit(trainer.args))
    columns = [key for key in inputs[0] if key not in _NOT_FORWARDED] if len(inputs) else []
    watch.update(rewards_per_func, list(getattr(trainer, "reward_func_names", [])), columns)
