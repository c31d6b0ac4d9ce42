"""One generic :class:`Registry` of named entries, as verl's ``register_policy_loss`` / ``register_adv_est``: the
advantage estimators (`trl_groupopt.core.estimators`) and the methods (`trl_groupopt.methods.registry`) are two."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

__all__ = ["Registry"]

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
