"""The Python API's refusals before the model loads (issue 52): what `GRPOTrainer.__init__` or transformers would
refuse only after the policy loaded, or take for something else (a misspelt reward function's name read as a Hub
reward model), refused at the door in one line naming the argument and the fix. The values of the config's options
are checked by `trl_groupopt.trainer.args_check`; the dataset's columns and prompts by `trl_groupopt.data.checks`."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from torch import nn

from ..data.adapters import check_model_path

__all__ = ["check_api_inputs"]


def _vllm_installed() -> bool:
    if "vllm" in sys.modules:  # imported (or stood in for) already
        return True
    return importlib.util.find_spec("vllm") is not None


def _reward_model_problem(name: str, revision: str | None) -> str | None:
    """Why the string reward function `name` is neither a local model folder nor a model on the Hub, or None."""
    if os.path.isdir(os.path.expanduser(name)):
        return None
    from huggingface_hub import hf_hub_download

    try:  # the first file AutoModelForSequenceClassification reads: cached, or fetched unless offline
        hf_hub_download(name, "config.json", revision=revision)
    except Exception as error:  # noqa: BLE001  (invalid id, not found, offline and not cached, gated: all say why)
        return str(error).splitlines()[0][:160] or type(error).__name__
    return None


def _check_reward_funcs(reward_funcs: Any, args: Any, has_environments: bool) -> None:
    funcs = (
        list(reward_funcs)
        if isinstance(reward_funcs, list | tuple)
        else []
        if reward_funcs is None
        else [reward_funcs]
    )
    if not funcs and not has_environments:
        raise ValueError(
            f"No reward source provided (reward_funcs={reward_funcs!r}): nothing to learn from. Pass reward_funcs=[fn] (a function "
            "of the completions returning one number each), a reward model's Hub id or folder, or an "
            "environment_factory whose environments define get_reward."
        )
    revision = (getattr(args, "model_init_kwargs", None) or {}).get("revision")
    for i, func in enumerate(funcs):
        where = f"reward_funcs[{i}]" if isinstance(reward_funcs, list | tuple) else "reward_funcs"
        if isinstance(func, str):
            if (problem := _reward_model_problem(func, revision)) is not None:
                raise ValueError(
                    f"{where}={func!r} is read as a reward model (a string), but it is neither a local model folder "
                    f"nor a model on the Hub ({problem}). Pass the reward function itself (the callable, not its "
                    "name), or a reward model's Hub id or folder."
                )
        elif not callable(func) and not isinstance(func, nn.Module):
            raise ValueError(
                f"{where}={func!r} ({type(func).__name__}) is not a reward: pass a function of the completions "
                "returning one number each, a reward model (nn.Module), or a reward model's Hub id or folder."
            )
    weights = getattr(args, "reward_weights", None)
    if weights is not None and len(weights) != len(funcs):
        raise ValueError(
            f"reward_weights has {len(weights)} weight(s) for {len(funcs)} reward function(s): give one weight per "
            "function, in the order of reward_funcs, or leave reward_weights=None (each weighs 1)."
        )


def check_api_inputs(model: Any, reward_funcs: Any, args: Any, train_dataset: Any, environment_factory: Any) -> None:
    """Raise a one-line `ValueError` (`FileNotFoundError` for a missing model folder, `ImportError` for vLLM) naming
    the argument and the fix, before anything loads."""
    _check_reward_funcs(reward_funcs, args, has_environments=environment_factory is not None)
    if train_dataset is None:
        raise ValueError(
            "train_dataset=None: GRPOTrainer trains on a dataset of prompts. Pass train_dataset=datasets.Dataset"
            ".from_list([{'prompt': ...}, ...]) or a loaded dataset's split (dataset['train'])."
        )
    if isinstance(train_dataset, list | tuple) or type(train_dataset) is dict:
        raise ValueError(
            f"train_dataset is a plain {type(train_dataset).__name__}: GRPOTrainer needs a datasets.Dataset (or "
            "IterableDataset). Wrap it: datasets.Dataset.from_list(rows) (a list of {'prompt': ...} rows) or "
            "datasets.Dataset.from_dict(columns)."
        )
    if getattr(args, "use_vllm", False) and not _vllm_installed():
        raise ImportError(
            "use_vllm=True, but vLLM is not installed here: install it (pip install vllm, on a machine with a GPU) "
            "or leave use_vllm=False (transformers generates)."
        )
    if isinstance(model, str):
        check_model_path(model, option="model")
