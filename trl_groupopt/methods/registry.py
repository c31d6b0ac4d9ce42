"""The methods: every :class:`~trl_groupopt.methods.spec.MethodSpec` that a method folder's ``spec.py``
(`trl_groupopt/methods/<name>/spec.py`) defines at its top level, registered in :data:`METHODS` on import, and
``register_method`` for a method kept outside the package (docs/adding-a-method.md), and the modules that installed
packages declare in the entry-point group ``trl_groupopt.methods`` (imported here, so their methods register). TRL-free:
the CLI lists methods before TRL is imported."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import warnings
from typing import Any

from ..core.registry import Registry
from .spec import MethodSpec, Paper

__all__ = ["ENTRY_POINT_GROUP", "METHODS", "MethodSpec", "Paper", "config_class", "get_method", "import_methods",
           "register_method", "spec_for", "trainer_class", "unregister_method"]  # fmt: skip

#: The entry-point group of packages that add methods: each entry names a module whose import registers them
#: (``[project.entry-points."trl_groupopt.methods"] my_method = "my_package.my_module"``).
ENTRY_POINT_GROUP = "trl_groupopt.methods"


def discover() -> tuple[MethodSpec, ...]:
    """The specs of the method folders under `trl_groupopt/methods/`: the baseline first, then by folder name, then in
    the order each ``spec.py`` defines them."""
    specs = []
    for folder in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
        if not folder.ispkg:
            continue
        namespace = vars(importlib.import_module(f"{__package__}.{folder.name}.spec"))
        specs += [v for v in namespace.values() if isinstance(v, MethodSpec) and all(v is not s for s in specs)]
    return tuple(sorted(specs, key=lambda spec: spec.trainer_name != "GroupOptTrainer"))


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


def trainer_class(name: str) -> type:
    """The trainer class of the method registered as `name` (imports TRL)."""
    return get_method(name).trainer_class


def config_class(name: str) -> type:
    """The config class of the method registered as `name` (imports TRL)."""
    return get_method(name).config_class


def import_methods(modules: list[str]) -> None:
    """Import each module of `modules` (``--import``), which registers its methods; a module that cannot be imported
    is a ValueError naming it."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"--import {module}: {err} (give an importable module name; the current directory and "
                             "PYTHONPATH are searched).") from None  # fmt: skip


def load_entry_points() -> None:
    """Import the modules of the `ENTRY_POINT_GROUP` entry points; one that fails warns, naming it, and is skipped."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as err:  # a broken plug-in must not stop the library from importing
            warnings.warn(f"trl-groupopt: the {ENTRY_POINT_GROUP} entry point {entry.name} = {entry.value} failed to "
                          f"load and is skipped: {type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)  # fmt: skip


def spec_for(trainer_class: type) -> MethodSpec | None:
    """The spec of the nearest class in `trainer_class`'s MRO that a spec names; None when a class in between has its
    own `objective` (it trains another method)."""
    for klass in trainer_class.__mro__:
        spec = next((spec for spec in METHODS.values() if spec.names_trainer(klass)), None)
        if spec is not None:
            return spec
        if "objective" in klass.__dict__:
            return None
    return None


def load_estimators() -> None:
    """Register the advantage estimators the methods define (a spec's `estimator`), once: the TRL shell calls it
    before its configs list the estimators' knobs. Imports torch (the estimators are torch functions)."""
    from ..core.estimators import ESTIMATORS, register_estimator

    for spec in METHODS.values():
        if spec.is_estimator and spec.name not in ESTIMATORS:
            register_estimator(spec.estimator)


for _spec in discover():
    METHODS.register(_spec.name, _spec)
load_entry_points()  # last: a plug-in's module imports this one
