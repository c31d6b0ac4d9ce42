"""The registry of methods: one place that names every trainer, so nothing else keeps a list.

Each trainer module registers its method(s) when it is imported (``trl_groupopt`` imports them all)::

    register_method("echo", config_class=ECHOConfig, trainer_class=ECHOTrainer, paper="ECHO (batch-level clip)",
                    headline_metric="echo/batch_clipped")

The CLI (``trl-groupopt train --method NAME``), the example scripts, the benchmarks, the notebook and the
parametrised tests all read :data:`METHODS`. A *mode* of a trainer (GRPO-fix is ``DFPOTrainer`` with
``dfpo_transform="symmetric_clip"``) is registered with ``config_defaults``; :meth:`MethodSpec.make_config` applies
them under the caller's own arguments. See docs/adding-a-method.md for the files a new method needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trl import GRPOConfig

    from .trainers.base import GroupOptTrainer

__all__ = ["METHODS", "MethodSpec", "get_method", "register_method", "unregister_method"]


@dataclass(frozen=True)
class MethodSpec:
    """What the rest of the library needs to know about one method."""

    name: str  # the registry key, e.g. "echo"; also the CLI's --method value
    config_class: type[GRPOConfig]  # the trainer's config (a GRPOConfig subclass)
    trainer_class: type[GroupOptTrainer]  # the GRPOTrainer subclass
    paper: str  # "arXiv:XXXX.XXXXX" (or the title when there is no arXiv id)
    headline_metric: str  # the logged metric that shows the mechanism acting, e.g. "echo/batch_clipped"
    config_defaults: Mapping[str, Any] = field(default_factory=dict)  # a mode's fixed settings, e.g. GRPO-fix's
    summary: str = ""  # one line: what changes versus GRPO

    def make_config(self, **kwargs: Any) -> GRPOConfig:
        """This method's config: ``config_defaults`` first, then ``kwargs`` (the caller wins)."""
        return self.config_class(**{**self.config_defaults, **kwargs})


_METHODS: dict[str, MethodSpec] = {}
#: Read-only view of the registered methods, name -> :class:`MethodSpec`, in registration order.
METHODS: Mapping[str, MethodSpec] = MappingProxyType(_METHODS)


def register_method(
    name: str,
    *,
    config_class: type[GRPOConfig],
    trainer_class: type[GroupOptTrainer],
    paper: str,
    headline_metric: str,
    config_defaults: Mapping[str, Any] | None = None,
    summary: str = "",
) -> MethodSpec:
    """Register a method under ``name``; raises ``ValueError`` if the name is taken or the classes do not fit."""
    if name in _METHODS:
        raise ValueError(
            f"A method named {name!r} is already registered (by {_METHODS[name].trainer_class.__qualname__}); "
            "choose another name or call unregister_method first."
        )
    if not name or not name.replace("_", "").isalnum() or name != name.lower():
        raise ValueError(f"Method names are lower-case identifiers (they are CLI values), got {name!r}.")
    trainer_config = getattr(trainer_class, "config_class", None)
    if trainer_config is None or not issubclass(config_class, trainer_config):
        raise ValueError(
            f"{trainer_class.__qualname__} reads a {getattr(trainer_config, '__name__', None)}, but method {name!r} "
            f"registers config_class={config_class.__name__}; register the trainer's own config class."
        )
    spec = MethodSpec(
        name=name,
        config_class=config_class,
        trainer_class=trainer_class,
        paper=paper,
        headline_metric=headline_metric,
        config_defaults=MappingProxyType(dict(config_defaults or {})),
        summary=summary,
    )
    _METHODS[name] = spec
    return spec


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
