"""The shipped methods' specs (TRL-free data: names, papers, summaries, headline metrics, trainer import paths).

One module per method; :data:`SHIPPED` is what ``trl_groupopt.registry`` registers when it is imported. A new method
adds its module here (docs/adding-a-method.md).
"""

from __future__ import annotations

from . import ctpo, dfpo, echo, grpo, otb

__all__ = ["MECHANISM_ACTS", "SHIPPED"]

#: Every shipped method, in the order the CLI lists them.
SHIPPED = (grpo.METHOD, ctpo.METHOD, dfpo.METHOD, dfpo.GRPO_FIX_METHOD, echo.METHOD, otb.METHOD)

#: When a logged optimizer step shows each shipped method's mechanism changing the objective: method -> (what acted,
#: the logged keys, a predicate on their values), from the methods' `Mechanism` definitions (the trainers' report and
#: the stress benchmark read the same ones).
MECHANISM_ACTS = {spec.name: (spec.mechanism.what, spec.mechanism.keys, spec.mechanism.acts) for spec in SHIPPED}
