"""The shipped methods' specs: TRL-free data (names, papers, summaries, mechanisms, trainer import paths).

One module per method; every :class:`~trl_groupopt.spec.MethodSpec` a module of this package defines at its top level
is shipped (a mode, such as DFPO's GRPO-fix, is a second spec in its method's module). A new method adds its module
and nothing here (docs/adding-a-method.md).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..spec import MethodSpec

__all__ = ["MECHANISM_ACTS", "SHIPPED", "discover"]


def discover() -> tuple[MethodSpec, ...]:
    """Every `MethodSpec` the modules of this package (every folder of its `__path__`) define at their top level."""
    specs = []
    for module in pkgutil.iter_modules(__path__):
        namespace = vars(importlib.import_module(f"{__name__}.{module.name}"))
        specs += [v for v in namespace.values() if isinstance(v, MethodSpec) and all(v is not s for s in specs)]
    return tuple(sorted(specs, key=lambda spec: spec.trainer_name != "GroupOptTrainer"))  # the baseline first


#: Every shipped method: the baseline (TRL's objective, the base trainer) first, then by module name, then in the order
#: its module defines them.
SHIPPED = discover()

#: method -> (what acted, the logged keys, the predicate), from the methods' `Mechanism` definitions (the trainers'
#: report and the stress benchmark read the same ones).
MECHANISM_ACTS = {spec.name: (spec.mechanism.what, spec.mechanism.keys, spec.mechanism.acts) for spec in SHIPPED}
