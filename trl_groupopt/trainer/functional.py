"""The trainer and config classes of a function objective (`trl_groupopt.methods.functional.register_objective`),
built on first use as attributes of this module (``from trl_groupopt.trainer.functional import SAPOLikeTrainer``),
so that pickled configs and `spec_for` find them by import path like a method folder's classes."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor
from trl import GRPOConfig

from ..core.common import Groups, ObjectiveOutput
from ..methods.functional import FUNCTION_OBJECTIVES, FunctionObjective, class_prefix
from .base import GroupOptTrainer
from .config import AdvantageEstimatorConfigMixin, TokenSafeConfigMixin

__all__ = ["FunctionObjectiveTrainer", "classes"]


class _KnobChecks:
    """Checks a function objective's knobs before TRL's own post-init: a bad value fails at once, naming the knob."""

    function_objective: FunctionObjective

    def __post_init__(self):
        entry = type(self).function_objective
        try:
            entry.validate({knob: getattr(self, knob) for knob in entry.knobs})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None
        super().__post_init__()


class FunctionObjectiveTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] whose objective is a registered function (`function_objective`), called with the config's
    knobs as keywords (and the micro-batch's `Groups` for a group objective); a returned tensor is the loss."""

    function_objective: FunctionObjective

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any]) -> ObjectiveOutput:  # fmt: skip
        entry = self.function_objective
        knobs = {knob: getattr(self.args, knob) for knob in entry.knobs}
        if entry.needs_whole_groups:
            knobs["groups"] = Groups.contiguous(per_token_logps.shape[0], self.group_size)
        out = entry.function(per_token_logps, old_per_token_logps, advantages, mask, **knobs)
        return out if isinstance(out, ObjectiveOutput) else ObjectiveOutput(per_token_loss=out)


def _build(entry: FunctionObjective) -> tuple[type, type]:
    """(`<Prefix>Config`, `<Prefix>Trainer`) of `entry`: a dataclass with the knobs as fields over every method
    config's bases, and a `FunctionObjectiveTrainer` reading it."""
    prefix, module = class_prefix(entry.name), __name__
    fields = [(knob, type(default), dataclasses.field(default=default, metadata={"help": f"{entry.name}: {knob}."}))
              for knob, default in entry.knobs.items()]  # fmt: skip
    doc = (
        f"Configuration class for [`{prefix}Trainer`]: every parameter of [`trl.GRPOConfig`] and {list(entry.knobs)}."
    )
    config = dataclasses.make_dataclass(
        f"{prefix}Config", fields, repr=False,
        bases=(_KnobChecks, TokenSafeConfigMixin, AdvantageEstimatorConfigMixin, GRPOConfig),
        namespace={"__doc__": doc, "__module__": module, "function_objective": entry},
    )  # fmt: skip
    doc = f"[`trl.GRPOTrainer`] with the registered objective {entry.name!r} ({entry.function.__qualname__})."
    trainer = type(f"{prefix}Trainer", (FunctionObjectiveTrainer,), {
        "__doc__": doc, "__module__": module, "config_class": config, "function_objective": entry,
        "requires_whole_groups": entry.needs_whole_groups})  # fmt: skip
    return config, trainer


_BUILT: dict[str, tuple[type, type]] = {}


def classes(name: str) -> tuple[type, type]:
    """(config class, trainer class) of the function objective registered as `name`, built once."""
    entry = FUNCTION_OBJECTIVES[name]
    built = _BUILT.get(name)
    if built is None or built[1].function_objective is not entry:  # re-registered: build anew
        built = _BUILT[name] = _build(entry)
    return built


def __getattr__(attribute: str) -> type:
    for name in FUNCTION_OBJECTIVES:
        prefix = class_prefix(name)
        if attribute in (f"{prefix}Config", f"{prefix}Trainer"):
            config, trainer = classes(name)
            return config if attribute.endswith("Config") else trainer
    raise AttributeError(
        f"module {__name__!r} has no attribute {attribute!r}: no registered objective defines it; import the module "
        "that registers it first (the command line's --import MODULE, or install its package)"
    )
