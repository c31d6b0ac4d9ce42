"""PEP 562 lazy exports: a package lists its public names by defining module and imports one on first access."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def load(package: str, exports: Mapping[str, str], name: str) -> Any:
    """`package`'s attribute `name`, imported now from the module `exports[name]` (relative to `package`) names."""
    if name not in exports:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(exports[name], package), name)


def names(package: str, exports: Mapping[str, str]) -> list[str]:
    """`dir(package)`: what it holds now and what it exports lazily."""
    return sorted(set(exports) | set(importlib.import_module(package).__dict__))
