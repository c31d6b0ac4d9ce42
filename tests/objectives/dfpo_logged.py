"""`dfpo_logged`: `dfpo_loss` plus the diagnostics `DFPOTrainer.objective` logs with it (`dfpo_diagnostics`), for the
tests that check both on one call."""

from __future__ import annotations

from trl_groupopt.methods.dfpo.diagnostics import dfpo_diagnostics
from trl_groupopt.methods.dfpo.objective import DFPOOutput, dfpo_loss


def dfpo_logged(*args, loss_type: str = "dapo", **kwargs) -> DFPOOutput:
    """`dfpo_loss(*args, **kwargs)` with `dfpo_diagnostics(..., loss_type)` merged into its metrics."""
    out = dfpo_loss(*args, **kwargs)
    out.metrics.update(dfpo_diagnostics(out.weights, loss_type))
    return out
