"""The registry of methods: one place that names every method, so nothing else keeps a list.

The shipped methods (``trl_groupopt/methods/``) are registered when this module is imported, from TRL-free specs that
name their trainer classes by import path: listing the methods, their papers and summaries imports no trainer, and
``spec.trainer_class`` imports the trainer (and TRL) on first use. Another method registers with its classes::

    register_method("toy", config_class=ToyConfig, trainer_class=ToyTrainer, paper="arXiv:2402.03300",
                    headline_metric="toy/adv_abs_mean")

The CLI (``trl-groupopt train --method NAME``), the example scripts, the benchmarks, the notebook and the
parametrised tests all read :data:`METHODS`. A *mode* of a trainer (GRPO-fix is ``DFPOTrainer`` with
``dfpo_transform="symmetric_clip"``) is registered with ``config_defaults``; :meth:`MethodSpec.make_config` applies
them under the caller's own arguments. See docs/adding-a-method.md for the files a new method needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .methods import SHIPPED
from .spec import MethodSpec, Paper

if TYPE_CHECKING:
    from trl import GRPOConfig

    from .mechanism import Mechanism
    from .trainers.base import GroupOptTrainer

__all__ = ["METHODS", "MethodSpec", "Paper", "get_method", "register_method", "unregister_method"]

_METHODS: dict[str, MethodSpec] = {}
#: Read-only view of the registered methods, name -> :class:`MethodSpec`, in registration order.
METHODS: Mapping[str, MethodSpec] = MappingProxyType(_METHODS)


def _check_classes(name: str, config_class: type, trainer_class: type) -> None:
    trainer_config = getattr(trainer_class, "config_class", None)
    if trainer_config is None or not issubclass(config_class, trainer_config):
        raise ValueError(
            f"{trainer_class.__qualname__} reads a {getattr(trainer_config, '__name__', None)}, but method {name!r} "
            f"registers config_class={config_class.__name__}; register the trainer's own config class."
        )


def _check_name(name: str) -> None:
    if name in _METHODS:
        raise ValueError(
            f"A method named {name!r} is already registered (by {_METHODS[name].trainer_name}); "
            "choose another name or call unregister_method first."
        )
    if not name or not name.replace("_", "").isalnum() or name != name.lower():
        raise ValueError(f"Method names are lower-case identifiers (they are CLI values), got {name!r}.")


def _add(spec: MethodSpec) -> MethodSpec:
    _check_name(spec.name)
    _METHODS[spec.name] = spec
    return spec


def register_method(
    name: str,
    *,
    config_class: type[GRPOConfig],
    trainer_class: type[GroupOptTrainer],
    paper: Paper | str,
    headline_metric: str,
    config_defaults: Mapping[str, Any] | None = None,
    summary: str = "",
    mechanism: Mechanism | None = None,
) -> MethodSpec:
    """Register a method with its classes; raises ``ValueError`` if the name is taken or the classes do not fit.

    ``mechanism``: when the method's mechanism acted on an optimizer step (``trl_groupopt.mechanism``); the trainer
    then logs ``acted/<name>`` and reports it at the end of ``train()``."""
    _check_name(name)
    _check_classes(name, config_class, trainer_class)
    spec = MethodSpec(
        name=name,
        trainer_class=trainer_class,
        config_class=config_class,
        paper=paper,
        headline_metric=headline_metric,
        summary=summary,
        config_defaults=config_defaults or {},
        mechanism=mechanism,
    )
    return _add(spec)


def unregister_method(name: str) -> None:
    """Remove a method (for tests that register a toy method)."""
    get_method(name)
    del _METHODS[name]


def get_method(name: str) -> MethodSpec:
    """The :class:`MethodSpec` registered as ``name``; the error lists the valid names."""
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"Unknown method {name!r}; registered methods: {', '.join(sorted(_METHODS))}.") from None


for _spec in SHIPPED:
    _add(_spec)
