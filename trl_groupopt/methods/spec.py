"""What the library knows about one method, as plain data: :class:`MethodSpec` and its :class:`Paper`. Nothing here
imports TRL: a spec names its classes by import path and resolves them on first read (the CLI lists methods first)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

from .mechanism import Mechanism

__all__ = ["MethodSpec", "Paper"]


@dataclass(frozen=True)
class Paper:
    """The paper a method comes from: model cards cite it, the CLI names it."""

    title: str
    bibtex: str  # the citation model cards carry
    arxiv_id: str | None = None  # "XXXX.XXXXX"; None for a paper without one
    section: str = ""  # the part of the paper a mode comes from, e.g. "App. H"

    def __str__(self) -> str:
        reference = f"arXiv:{self.arxiv_id}" if self.arxiv_id else self.title
        return f"{reference} ({self.section})" if self.section else reference

    @classmethod
    def arxiv(cls, key: str, title: str, arxiv_id: str, author: str, year: int, **more: str) -> Paper:
        """A paper on arXiv, its BibTeX ``@article`` built from the same title and id (``more``: further fields)."""
        entry = dict(
            title=f"{{{{{title}}}}}", author=f"{{{author}}}", year=year, eprint=f"{{arXiv:{arxiv_id}}}", **more
        )
        body = "".join(f"\n    {name:<12} = {value}," for name, value in entry.items())
        return cls(title, f"@article{{{key},{body}\n}}", arxiv_id)

    def trl_fields(self) -> dict[str, str | None]:
        return {"title": self.title, "id": self.arxiv_id, "citation": self.bibtex}


class _ClassField:
    """A dataclass field holding a class or its import path, read as the class; unset (None), as `fallback(spec)`."""

    def __init__(self, default: Any = MISSING, fallback: Callable[[MethodSpec], type] | None = None) -> None:
        self.default, self.fallback = default, fallback

    def __set_name__(self, owner: type, name: str) -> None:
        self.stored = "_" + name

    def __get__(self, spec: MethodSpec | None, owner: type | None = None) -> Any:
        if spec is None:  # the dataclass machinery asks for the default
            if self.default is MISSING:
                raise AttributeError(self.stored)
            return self.default
        target = _given(spec, self.stored[1:])
        if target is None and self.fallback:
            return self.fallback(spec)
        if isinstance(target, str):  # an import path, "package.module:ClassName"
            module, _, name = target.partition(":")
            return getattr(importlib.import_module(module), name)
        return target

    def __set__(self, spec: MethodSpec, value: str | type | None) -> None:
        spec.__dict__[self.stored] = value


@dataclass(frozen=True)
class MethodSpec:
    """What the rest of the library needs to know about one method (docs/adding-a-method.md)."""

    name: str  # the registry key, e.g. "echo"; also the CLI's --method value
    trainer_class: type = _ClassField()  # type: ignore[assignment]  # a GroupOptTrainer subclass
    paper: Paper | str  # a Paper, or for a method registered without one "arXiv:XXXX.XXXXX" / its title
    headline_metric: str  # the logged metric that shows the mechanism acting, e.g. "echo/batch_clipped"
    summary: str = ""  # one line: what changes versus GRPO
    config_class: type = _ClassField(None, lambda spec: spec.trainer_class.config_class)  # type: ignore[assignment]
    demo_defaults: Mapping[str, Any] = field(default_factory=dict)  # the CLI's settings on the embedded tiny policy
    display_name: str = ""  # the name model cards give the method (TRL's `_name`); default: name upper-cased
    mechanism: Mechanism | None = None  # when the method acted on an optimizer step; None: no report
    #: Config overrides under which the mechanism acts on a small off-policy batch (token log-ratios within about
    #: +-0.3, whole groups, ragged completions): the shared invariance tests train there and check that it acted.
    acting_settings: Mapping[str, Any] = field(default_factory=dict)
    #: The method *is* the advantage estimator of the same name (an `AdvantageEstimator`, or its import path), which
    #: every method config may then select; None: the method is an objective.
    estimator: Any = _ClassField(None)
    #: On-policy (old log-probs = current ones) the objective has the value and the gradient of this registered
    #: method's objective at its defaults ("grpo": TRL's clipped surrogate at ratio 1), which
    #: `trl_groupopt.testing.check_objective` checks; None: no such claim.
    on_policy_equals: str | None = None

    def __post_init__(self) -> None:
        if not self.display_name:
            object.__setattr__(self, "display_name", self.name.upper())
        if self.mechanism is not None:
            object.__setattr__(self, "mechanism", self.mechanism.bound_to(self.name))

    @property
    def is_estimator(self) -> bool:
        return _given(self, "estimator") is not None

    @property
    def trainer_name(self) -> str:
        target = _given(self, "trainer_class")
        return target.rpartition(":")[2] if isinstance(target, str) else target.__name__

    @property
    def exports(self) -> dict[str, str]:
        """``{class name: module}`` of the classes this spec names by import path."""
        paths = (_given(self, "trainer_class"), _given(self, "config_class"))
        return {path.rpartition(":")[2]: path.partition(":")[0] for path in paths if isinstance(path, str)}

    def names_trainer(self, klass: type) -> bool:
        """Whether this spec's trainer is `klass` (given as the class or its import path; nothing is imported)."""
        return _given(self, "trainer_class") in (klass, f"{klass.__module__}:{klass.__qualname__}")

    def make_config(self, **kwargs: Any) -> Any:
        """The method's config, ``config_class(**kwargs)``."""
        return self.config_class(**kwargs)


def _given(spec: MethodSpec, name: str) -> str | type | None:
    """What `spec` was given for the class field `name`: the class, its import path or None (nothing imported)."""
    return spec.__dict__["_" + name]
