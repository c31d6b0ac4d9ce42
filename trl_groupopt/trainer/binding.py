"""The one binding of a method config to its objective: fields named after the objective's keyword arguments by one
rule (`config_fields`), validated once under those names (`validate_config`), passed by the trainer
(`config_arguments`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def config_fields(function: Callable, config: Any, prefix: str = "") -> dict[str, str]:
    """``{argument: config field}`` for the keyword-only arguments of ``function`` that ``config`` sets: argument
    ``a`` is the field ``<prefix>a`` (``dfpo_transform``), else ``a``, else, for ``x_low``, ``x`` (TRL's lower clip
    is ``epsilon``, its upper one ``epsilon_high``)."""
    fields = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        candidates = (prefix + name, name, name.removesuffix("_low"))
        field_name = next((c for c in candidates if hasattr(config, c)), None)
        if field_name is not None:
            fields[name] = field_name
    return fields


def config_arguments(function: Callable, config: Any, prefix: str = "") -> dict[str, Any]:
    """``{argument: value}`` of `config_fields`; an unset ``epsilon_high`` reads as ``epsilon``, as TRL reads it."""
    values = {
        name: getattr(config, field_name) for name, field_name in config_fields(function, config, prefix).items()
    }
    if "epsilon_high" in values and values["epsilon_high"] is None:
        values["epsilon_high"] = config.epsilon  # mirrors GRPOTrainer.__init__ (trl 1.16.0): `self.epsilon_high`
    return values


def validate_config(validate: Callable, config: Any, prefix: str = "") -> None:
    """Run an objective's ``validate_<method>`` on the config's fields (`config_arguments`), so that an error names
    the field (e.g. ``dfpo_transform``), not the argument: the configs' one check."""
    validate(**config_arguments(validate, config, prefix), names=config_fields(validate, config, prefix))
