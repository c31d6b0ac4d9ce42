"""PEP 562 lazy exports: a package lists its public names by defining module and imports one on first access."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`package`'s `__getattr__` (imports `name` from the module `names[name]`, relative to `package`) and `__dir__`
    (what it holds now and what it exports lazily)."""

    def load(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(names[name], package), name)

    def listing() -> list[str]:
        return sorted(set(names) | set(importlib.import_module(package).__dict__))

    return load, listing
