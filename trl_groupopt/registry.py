"""One generic :class:`Registry`, for the methods (:data:`METHODS`) and the advantage estimators, as verl's
``register_policy_loss`` / ``register_adv_est``; the shipped methods register on import (docs/adding-a-method.md)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from .methods import SHIPPED
from .spec import MethodSpec, Paper

__all__ = ["METHODS", "MethodSpec", "Paper", "Registry", "get_method", "register_method", "unregister_method"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Named entries in registration order, a read-only mapping. `unknown` is the error for a missing name (formatted
    with `what`, `name`, `names`: the sorted names, comma-separated, and `choices`: the names' tuple)."""

    def __init__(self, what: str, unknown: str = "Unknown {what} {name!r}; registered: {names}.") -> None:
        self.what, self.unknown, self._entries = what, unknown, {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            by = getattr(self._entries[name], "trainer_name", None)
            raise ValueError(
                f"A {self.what} named {name!r} is already registered{f' (by {by})' if by else ''}; choose another "
                "name or unregister it first."
            )
        if not name or not name.replace("_", "").isalnum() or name != name.lower():
            raise ValueError(f"{self.what} names are lower-case identifiers (they are CLI values), got {name!r}.")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self.lookup(name)
        del self._entries[name]

    def lookup(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            names = ", ".join(sorted(self._entries))
            message = self.unknown.format(what=self.what, name=name, names=names, choices=tuple(self._entries))
            raise ValueError(message) from None

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


#: The registered methods, name -> :class:`MethodSpec`, in registration order.
METHODS: Registry[MethodSpec] = Registry("method", "Unknown method {name!r}; registered methods: {names}.")
get_method = METHODS.lookup  # a name's spec; an unknown name is a ValueError listing the registered ones
unregister_method = METHODS.unregister


def register_method(name: str, *, config_class: type, trainer_class: type, **fields: Any) -> MethodSpec:
    """Register a method with its classes and the other :class:`MethodSpec` ``fields``."""
    trainer_config = getattr(trainer_class, "config_class", None)
    if trainer_config is None or not issubclass(config_class, trainer_config):
        raise ValueError(
            f"{trainer_class.__qualname__} reads a {getattr(trainer_config, '__name__', None)}, but method {name!r} "
            f"registers config_class={config_class.__name__}; register the trainer's own config class."
        )
    return METHODS.register(name, MethodSpec(name, trainer_class, config_class=config_class, **fields))


def spec_for(trainer_class: type, config: Any) -> MethodSpec | None:
    """The spec of the nearest class in `trainer_class`'s MRO that a spec names (a mode's when `config` matches it);
    None when a class in between has its own `objective`."""
    for klass in trainer_class.__mro__:
        named_as = (klass, f"{klass.__module__}:{klass.__qualname__}")  # a spec names its class, or its import path
        specs = [spec for spec in METHODS.values() if spec.__dict__["_trainer_class"] in named_as]
        if specs:
            modes = [spec for spec in specs if spec.config_defaults and spec.matches(config)]
            return (modes or [spec for spec in specs if not spec.config_defaults] or [None])[0]
        if "objective" in klass.__dict__:
            return None
    return None


for _spec in SHIPPED:
    METHODS.register(_spec.name, _spec)
