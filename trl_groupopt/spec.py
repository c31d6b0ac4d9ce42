"""What the library knows about one method, as plain data: :class:`MethodSpec` and its :class:`Paper`.

Nothing here imports TRL: a spec may name its trainer class by import path (``"trl_groupopt.trainers.ctpo:CTPOTrainer"``)
and resolves it on first use, so the CLI can list the methods, their summaries and papers, and reject an unknown
``--method``, before TRL is imported. The shipped specs are in ``trl_groupopt/methods/``; the registry
(``trl_groupopt.registry``) collects them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trl import GRPOConfig

    from .mechanism import Mechanism
    from .trainers.base import GroupOptTrainer

__all__ = ["MethodSpec", "Paper"]


@dataclass(frozen=True)
class Paper:
    """The paper a method comes from, written once: model cards cite it, the CLI names it."""

    title: str
    bibtex: str  # the citation model cards carry
    arxiv_id: str | None = None  # "XXXX.XXXXX"; None for a paper without one
    section: str = ""  # the part of the paper a mode comes from, e.g. "App. H"

    def __str__(self) -> str:
        reference = f"arXiv:{self.arxiv_id}" if self.arxiv_id else self.title
        return f"{reference} ({self.section})" if self.section else reference

    def trl_fields(self) -> dict[str, str | None]:
        """The paper as TRL's trainers carry it (`_paper`: title, id, citation), for TRL's model card."""
        return {"title": self.title, "id": self.arxiv_id, "citation": self.bibtex}


def resolve(target: str | type) -> type:
    """A class, or the class an import path ``"package.module:ClassName"`` names (imported now)."""
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class _ClassField:
    """A dataclass field that holds a class or its import path and reads as the class (imported on first read).

    `default`: the value when the field is not given (read then through `fallback(spec)` if set)."""

    def __init__(self, default: Any = MISSING, fallback: Callable[[MethodSpec], type] | None = None) -> None:
        self.default, self.fallback = default, fallback

    def __set_name__(self, owner: type, name: str) -> None:
        self.stored = "_" + name

    def __get__(self, spec: MethodSpec | None, owner: type | None = None) -> Any:
        if spec is None:  # the dataclass machinery asks for the default
            if self.default is MISSING:
                raise AttributeError(self.stored)
            return self.default
        target = spec.__dict__[self.stored]
        return self.fallback(spec) if target is None and self.fallback else resolve(target)

    def __set__(self, spec: MethodSpec, value: str | type | None) -> None:
        spec.__dict__[self.stored] = value


@dataclass(frozen=True)
class MethodSpec:
    """What the rest of the library needs to know about one method.

    ``trainer_class`` and ``config_class`` are given as classes or as import paths (``"module:ClassName"``) and read
    as classes: a path is imported on first read. ``config_class=None`` means the trainer's own ``config_class``.
    """

    name: str  # the registry key, e.g. "echo"; also the CLI's --method value
    trainer_class: type[GroupOptTrainer] = _ClassField()  # type: ignore[assignment]  # a GRPOTrainer subclass
    # (no default: `_ClassField()` only makes the field read as a class)
    paper: Paper | str  # a Paper, or for a method registered without one "arXiv:XXXX.XXXXX" / its title
    headline_metric: str  # the logged metric that shows the mechanism acting, e.g. "echo/batch_clipped"
    summary: str = ""  # one line: what changes versus GRPO
    config_class: type[GRPOConfig] = _ClassField(None, lambda spec: spec.trainer_class.config_class)  # type: ignore
    config_defaults: Mapping[str, Any] = field(default_factory=dict)  # a mode's fixed settings, e.g. GRPO-fix's
    demo_defaults: Mapping[str, Any] = field(default_factory=dict)  # the CLI's settings on the embedded tiny policy
    display_name: str = ""  # the name model cards give the method (TRL's `_name`); default: name upper-cased
    #: When the method's mechanism acted on an optimizer step (`trl_groupopt.mechanism`); None: no report.
    mechanism: Mechanism | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_defaults", MappingProxyType(dict(self.config_defaults)))
        if not self.display_name:
            object.__setattr__(self, "display_name", self.name.upper())

    @property
    def trainer_name(self) -> str:
        """The trainer class's name, without importing it."""
        target = self.__dict__["_trainer_class"]
        return target.rpartition(":")[2] if isinstance(target, str) else target.__name__

    def make_config(self, **kwargs: Any) -> GRPOConfig:
        """This method's config: ``config_defaults`` first, then ``kwargs`` (the caller wins)."""
        return self.config_class(**{**self.config_defaults, **kwargs})
