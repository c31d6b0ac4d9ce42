"""trl-groupopt: group RL objectives for LLM reasoning as drop-in TRL trainers (`from trl_groupopt import
<Method>Config, <Method>Trainer` instead of GRPOConfig, GRPOTrainer; `trl_groupopt.METHODS` lists them).

The package's folders are its layers: `core/` the pure math every objective uses, `methods/<name>/` one method each
(objective, config and trainer, spec), `trainer/` the TRL shell (`GroupOptTrainer`), `runfolder/` a run's folder,
`data/` the data door, `cli/` the command line, `comparison/` `trl-groupopt compare`. A method in one function:
`register_objective`, `register_estimator` (docs/adding-a-method.md). Names are imported on first use (PEP 562):
importing the package imports no TRL."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_REGISTRY = ("METHODS", "MethodSpec", "Paper", "config_class", "get_method", "register_method", "trainer_class")
_FUNCTIONAL = ("register_estimator", "register_objective")


def _exports() -> dict[str, str]:
    """public name -> defining module: the registry's names, the classes every spec names, `compare`."""
    from .methods.registry import METHODS

    classes = {name: module for spec in METHODS.values() for name, module in spec.exports.items()}
    return {**dict.fromkeys(_REGISTRY, "trl_groupopt.methods.registry"), **classes,
            **dict.fromkeys(_FUNCTIONAL, "trl_groupopt.methods.functional"),
            "compare": "trl_groupopt.comparison.driver"}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _exports().get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(_exports()) | set(globals()))
