"""What the library knows about one method, as plain data: :class:`MethodSpec` and its :class:`Paper`.

Nothing here imports TRL: a spec names its trainer class by import path (``"trl_groupopt.trainers.ctpo:CTPOTrainer"``)
and resolves it on first use, so the CLI can list the methods, their summaries and papers, and reject an unknown
``--method``, before TRL is imported. The shipped specs are in ``trl_groupopt/methods/``; the registry
(``trl_groupopt.registry``) collects them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trl import GRPOConfig

    from .trainers.base import GroupOptTrainer

__all__ = ["MethodSpec", "Paper"]


@dataclass(frozen=True)
class Paper:
    """The paper a method comes from, written once: model cards cite it, the CLI names it."""

    title: str
    bibtex: str  # the citation model cards carry
    arxiv_id: str | None = None  # "2605.07331"; None for a paper without one
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


@dataclass(frozen=True)
class MethodSpec:
    """What the rest of the library needs to know about one method.

    ``trainer`` and ``config`` are classes or import paths; :attr:`trainer_class` and :attr:`config_class` resolve
    them. ``config=None`` means the trainer's own ``config_class``.
    """

    name: str  # the registry key, e.g. "echo"; also the CLI's --method value
    trainer: str | type[GroupOptTrainer]  # the GRPOTrainer subclass, or its import path
    paper: Paper | str  # a Paper, or for a method registered without one "arXiv:XXXX.XXXXX" / its title
    headline_metric: str  # the logged metric that shows the mechanism acting, e.g. "echo/batch_clipped"
    summary: str = ""  # one line: what changes versus GRPO
    config: str | type[GRPOConfig] | None = None  # the config class (a GRPOConfig subclass), or its import path
    config_defaults: Mapping[str, Any] = field(default_factory=dict)  # a mode's fixed settings, e.g. GRPO-fix's
    display_name: str = ""  # the name model cards give the method (TRL's `_name`); default: name upper-cased

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_defaults", MappingProxyType(dict(self.config_defaults)))
        if not self.display_name:
            object.__setattr__(self, "display_name", self.name.upper())

    @property
    def trainer_class(self) -> type[GroupOptTrainer]:
        """The trainer class (imports its module, and TRL, on first use)."""
        return resolve(self.trainer)

    @property
    def config_class(self) -> type[GRPOConfig]:
        """The config class: ``config``, or the trainer's own."""
        return self.trainer_class.config_class if self.config is None else resolve(self.config)

    @property
    def trainer_name(self) -> str:
        """The trainer class's name, without importing it."""
        return self.trainer.rpartition(":")[2] if isinstance(self.trainer, str) else self.trainer.__name__

    def make_config(self, **kwargs: Any) -> GRPOConfig:
        """This method's config: ``config_defaults`` first, then ``kwargs`` (the caller wins)."""
        return self.config_class(**{**self.config_defaults, **kwargs})
