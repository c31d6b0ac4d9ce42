"""Checks of the data and reward functions that name the fix, not a ``KeyError`` from inside TRL once the model
loaded: docs/reliability.md, "Errors at the door", "No reward is an error", "Rewards as `GRPOTrainer` takes them"."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from trl.trainer.utils import get_callable_name, is_async_callable

from .prompts import check_prompts

#: Keyword arguments GRPOTrainer passes to every reward function besides the dataset columns (``environments`` only
#: with an ``environment_factory``).
# mirrors GRPOTrainer._calculate_rewards (trl 1.16.0): the reward functions' keyword arguments
TRL_REWARD_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
#: Dataset columns GRPOTrainer does not forward to reward functions (they arrive as ``prompts``/``completions``).
_NOT_FORWARDED = ("prompt", "completion", "completion_ids")
#: Consecutive generation batches with no reward at all before training stops.
DEFAULT_MAX_ALL_NONE_REWARD_BATCHES = 2
#: The prompts :func:`check_train_dataset` reads (the command line's door reads every row).
PROMPT_SAMPLE = 100


def _check_reward_signature(func: Callable, columns: list[str], has_environments: bool) -> None:
    """The reward function can be called with what GRPOTrainer passes: its required parameters are present."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins, C callables: nothing to read
        return
    supplied = {*TRL_REWARD_KWARGS, *(["environments"] if has_environments else [])}
    supplied |= {c for c in columns if c not in _NOT_FORWARDED}
    name = get_callable_name(func)
    for p in params:
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise ValueError(
                f"Reward function {name!r} has a positional-only parameter {p.name!r}: GRPOTrainer calls "
                "reward functions with keyword arguments only (completions=..., prompts=..., <column>=...)."
            )
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in supplied:
            hint = f" Add a {p.name!r} column (dataset.map or rename_column), or give the parameter a default."
            if p.name in _NOT_FORWARDED:
                hint = " GRPOTrainer passes the prompt as `prompts` (plural), not as a column."
            raise ValueError(
                f"Reward function {name!r} needs the argument {p.name!r}, which the training data does not provide: "
                f"train_dataset has columns {columns}, and GRPOTrainer also passes {sorted(TRL_REWARD_KWARGS)}.{hint}"
            )
    extra = sorted(supplied - {p.name for p in params})
    if extra and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise ValueError(
            f"Reward function {name!r} does not accept **kwargs, but GRPOTrainer passes every dataset column and its "
            f"own arguments as keywords (it would fail on {extra}): def {name}(completions, **kwargs)."
        )


def check_train_dataset(train_dataset: Any, reward_funcs: Any = None, *, has_environments: bool = False) -> None:
    """Raise a ``ValueError`` naming the fix if GRPOTrainer could not train on ``train_dataset`` with ``reward_funcs``
    (docs/reliability.md, "Errors at the door"); ``None`` arguments and unknown columns are skipped."""
    columns = getattr(train_dataset, "column_names", None)  # an IterableDataset's: its features', None if unknown
    if isinstance(columns, dict):  # a DatasetDict: the caller passed the whole dict, not a split
        raise ValueError(f"train_dataset is a DatasetDict ({sorted(columns)}): pass one split, e.g. dataset['train'].")
    columns = None if columns is None else list(columns)
    if columns is not None and "prompt" not in columns and not has_environments:
        hint = " Rename your prompt column with dataset.rename_column(<name>, 'prompt')."
        for column, form in (("problem", "math"), ("question", "gsm8k")):  # the last one found names the fix
            if column in columns:
                hint = f" It has {column!r}: map it with trl_groupopt.data.adapters.{form}_to_conversational, or rename it."
        raise ValueError(
            f"train_dataset has no 'prompt' column (columns: {columns}). GRPOTrainer reads the prompts from 'prompt': "
            f"a string (standard format) or a list of {{'role', 'content'}} messages (conversational).{hint}"
        )
    if columns is not None and hasattr(train_dataset, "__getitem__") and hasattr(train_dataset, "__len__"):
        if len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: there is nothing to train on.")
        if "prompt" in columns:
            sample = train_dataset[:PROMPT_SAMPLE]["prompt"]
            check_prompts(sample, "prompt", "train_dataset", messages_allowed=True, media_allowed=True)
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    for func in funcs if columns is not None else ():
        if callable(func) and not isinstance(func, str | torch.nn.Module):
            _check_reward_signature(func, columns, has_environments)


def _reward_value_problem(value: Any) -> str | None:
    """Why GRPOTrainer could not read ``value`` as one reward (a number, bool, 0-d tensor or array, None), or None."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        return "a string"
    if isinstance(value, torch.Tensor) and value.is_meta:  # a shape but no value: TRL's `.item()` fails naming nothing
        return "a tensor on the meta device, which holds no value: compute it on the CPU or GPU"
    try:  # a tensor as it is: torch.tensor(tensor) warns
        converted = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return "not a number"
    return None if converted.ndim == 0 else f"of shape {tuple(converted.shape)}, not one number"


def check_reward_output(name: str, output: Any, num_expected: int | None = None) -> None:
    """Raise naming the reward function unless `GRPOTrainer._calculate_rewards` reads ``output`` as one per completion."""
    rule = "reward functions return one float (or None to skip it) per completion: a list, or a 1-D array or tensor"
    if isinstance(output, str | bytes | Mapping) or not hasattr(output, "__len__") or not hasattr(output, "__iter__"):
        raise TypeError(f"Reward function {name!r} returned {type(output).__name__} {str(output)[:60]!r}; {rule}.")
    if isinstance(output, torch.Tensor | np.ndarray) and output.ndim != 1:
        raise TypeError(
            f"Reward function {name!r} returned a {type(output).__name__} of shape {tuple(output.shape)}; {rule}."
        )
    for i, value in enumerate(output):
        problem = _reward_value_problem(value)
        if problem is not None:
            raise TypeError(
                f"Reward function {name!r} returned {type(value).__name__} {str(value)[:60]!r} for completion {i} "
                f"({problem}); {rule}."
            )
    if num_expected is not None and len(output) != num_expected:
        raise ValueError(
            f"Reward function {name!r} returned {len(output)} rewards for {num_expected} completions: "
            "return exactly one reward per completion."
        )


def check_finite_rewards(rewards_per_func: torch.Tensor, func_names: Sequence[str]) -> None:
    """Raise naming the function and the completion if a reward of the (N, F) generation batch, gathered over
    processes (every rank raises), is +-inf; NaN is TRL's mark of an unscorable completion and passes."""
    infinite = torch.isinf(rewards_per_func)
    if not bool(infinite.any()):
        return
    row, column = (int(i) for i in infinite.nonzero()[0])
    raise ValueError(  # TRL names every column, an environment's reward included
        f"Reward function {func_names[column]!r} returned {rewards_per_func[row, column].item()} for completion {row} "
        f"of the generation batch ({int(infinite.sum())} infinite reward(s) in this batch). Rewards must be finite "
        "numbers within float32's range (|r| < 3.4e38); return None (or NaN) for a completion it cannot score."
    )


def _overflows(grouped: torch.Tensor) -> torch.Tensor:
    """(K,) True where float32 cannot take the mean and standard deviation of a group's scored values (K, G)."""
    from trl.trainer.utils import nanstd  # TRL's own, as its advantage code calls it

    scored = (~torch.isnan(grouped)).sum(dim=1)  # (K,)
    mean, std = torch.nanmean(grouped, dim=1), nanstd(grouped, dim=1)  # (K,), NaN below 1 / 2 scored values
    return ((scored >= 1) & ~torch.isfinite(mean)) | ((scored >= 2) & ~torch.isfinite(std))


def check_reward_scale(trainer: Any, rewards_per_func: torch.Tensor) -> None:
    """Raise naming the reward function when float32 cannot centre (and scale) the (N, F) rewards of a generation
    batch per group, as TRL's advantage code does: finite rewards near float32's limit overflow the group's mean or
    standard deviation, TRL's `nan_to_num` then turns every advantage into 0, and the run trains nothing."""
    group = trainer.group_size
    weighted = rewards_per_func * trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)  # (N, F)
    if trainer.multi_objective_aggregation == "normalize_then_sum":  # each function is centred on its own
        bad = [k for k in range(weighted.shape[1]) if bool(_overflows(rewards_per_func[:, k].view(-1, group)).any())]
    else:  # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): the weighted sum, centred per group
        total = weighted.nansum(dim=1)
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        overflow = bool(_overflows(total.view(-1, group)).any())
        bad = [int(weighted.nan_to_num(0.0).abs().amax(dim=0).argmax())] if overflow else []
    if not bad:
        return
    column, limit = bad[0], (torch.finfo(torch.float32).max / (4 * group)) ** 0.5
    largest = weighted[:, column].nan_to_num(0.0).abs().max().item()
    raise ValueError(
        f"Reward function {trainer.reward_func_names[column]!r} returned rewards so large (|reward x weight| up to "
        f"{largest:.3g}) that float32 cannot take their group mean and standard deviation (groups of {group}): "
        "every advantage would be 0 and nothing would be learnt. Rescale the reward so that |reward x weight| "
        f"stays below {limit:.1e} (dividing every reward by one constant changes no scaled advantage)."
    )


class CheckedRewardFunc:
    """A reward function whose return value is checked (:func:`check_reward_output`). A class, not a closure, so it
    pickles whenever the wrapped function does; ``__wrapped__`` gives ``inspect.signature`` the original's."""

    def __init__(self, func: Callable):
        self.__wrapped__ = func
        self.__name__ = get_callable_name(func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self.__wrapped__(*args, **kwargs)
        completions = kwargs.get("completions")
        check_reward_output(self.__name__, output, None if completions is None else len(completions))
        return output


def checked_reward_func(func: Any) -> Any:
    """``func`` wrapped in :class:`CheckedRewardFunc`; async functions, reward models and model ids unchanged."""
    if isinstance(func, str | torch.nn.Module | CheckedRewardFunc) or not callable(func) or is_async_callable(func):
        return func
    return CheckedRewardFunc(func)


def prepare_trainer_inputs(reward_funcs: Any, train_dataset: Any, environment_factory: Any = None) -> Any:
    """The trainers' construction-time check; returns the reward functions wrapped by :func:`checked_reward_func`."""
    check_train_dataset(train_dataset, reward_funcs, has_environments=environment_factory is not None)
    if isinstance(reward_funcs, list | tuple):
        return [checked_reward_func(f) for f in reward_funcs]
    return checked_reward_func(reward_funcs)


class AllNoneRewardWatch:
    """Counts generation batches in a row in which every reward was None (or NaN): each warns; ``limit`` of them raise
    (a run with no reward would "train" with zero loss and write checkpoints); ``limit=None`` only warns, as TRL."""

    def __init__(self, limit: int | None = DEFAULT_MAX_ALL_NONE_REWARD_BATCHES):
        self.limit = limit  # validated by the config (>= 1)
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
            f"generation batch ({self.consecutive} such batch(es) in a row{stops}). They received the dataset columns "
            f"{sorted(columns)}: check that the column each reads holds what it expects (a gold answer it parses)."
        )
        if self.limit is not None and self.consecutive >= self.limit:
            raise RuntimeError(
                f"{message} No reward means no learning signal, so training stops here; fix the reward "
                "functions or the data (or raise max_all_none_reward_batches)."
            )
        warnings.warn(message, UserWarning, stacklevel=3)


def watch_all_none_rewards(trainer: Any, rewards_per_func: torch.Tensor, inputs: Sequence[dict[str, Any]]) -> None:
    """Feed one generation batch's gathered (N, F) rewards to the trainer's :class:`AllNoneRewardWatch`."""
    limit = getattr(trainer.args, "max_all_none_reward_batches", None)  # None for TRL's GRPOConfig: warn only, as TRL
    watch = trainer.__dict__.setdefault("_all_none_reward_watch", AllNoneRewardWatch(limit))
    columns = [key for key in inputs[0] if key not in _NOT_FORWARDED] if len(inputs) else []
    watch.update(rewards_per_func, list(getattr(trainer, "reward_func_names", [])), columns)
