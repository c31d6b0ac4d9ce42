"""The shipped methods' specs, TRL-free: every :class:`~trl_groupopt.spec.MethodSpec` a module of this package defines
at its top level (docs/adding-a-method.md)."""

from __future__ import annotations

import importlib
import pkgutil

from ..spec import MethodSpec

__all__ = ["MECHANISM_ACTS", "SHIPPED", "discover"]


def discover() -> tuple[MethodSpec, ...]:
    specs = []
    for module in pkgutil.iter_modules(__path__):
        namespace = vars(importlib.import_module(f"{__name__}.{module.name}"))
        specs += [v for v in namespace.values() if isinstance(v, MethodSpec) and all(v is not s for s in specs)]
    return tuple(sorted(specs, key=lambda spec: spec.trainer_name != "GroupOptTrainer"))  # the baseline first


#: Every shipped method: the baseline first, then by module name, then in the order its module defines them.
SHIPPED = discover()

#: method -> (what acted, the logged keys, the predicate) (the stress benchmark reads it).
MECHANISM_ACTS = {spec.name: (spec.mechanism.what, spec.mechanism.keys, spec.mechanism.acts) for spec in SHIPPED}
