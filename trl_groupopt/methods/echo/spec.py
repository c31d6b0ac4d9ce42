"""ECHO: batch-level clipping with token-level importance sampling (equations: `trl_groupopt/methods/echo/objective.py`)."""

import textwrap

from ..mechanism import OFF_POLICY, Mechanism, Observed
from ..spec import MethodSpec, Paper

METHOD = MethodSpec(
    name="echo",
    trainer_class="trl_groupopt.methods.echo.trainer:ECHOTrainer",
    config_class="trl_groupopt.methods.echo.trainer:ECHOConfig",
    paper=Paper(
        title="ECHO: Efficient Coarse-grained Hybrid Optimization - Clip at Batch, Learn at Token",
        arxiv_id=None,  # a preprint under double-blind review
        bibtex=textwrap.dedent("""\
            @misc{echo2025,
                title        = {{ECHO: Efficient Coarse-grained Hybrid Optimization - Clip at Batch, Learn at Token}},
                author       = {Anonymous},
                year         = 2025,
                note         = {Paper under double-blind review},
            }"""),
    ),
    headline_metric="echo/batch_clipped",
    summary="token ratios times clip(R)/sg(R), R the geometric batch ratio",
    # ECHO acted on a step when its batch ratio R left the batch clip range (Eq. 7): only then does clip(R) / sg(R)
    # differ from R / sg(R) and the objective from token-clipped DAPO plus the coupling term.
    mechanism=Mechanism(
        name="ECHO's batch clip",
        what="the batch ratio R was clipped",
        keys=("echo/batch_clipped",),
        acts=lambda clipped: clipped > 0,
        observed=(Observed("R", "echo/batch_ratio"),),
        inert="this run trained as token-clipped DAPO plus the coupling term (Eq. 34)",
        hint=f"{OFF_POLICY} or narrow the batch clip (batch_epsilon, batch_epsilon_high) to inside the range R took",
    ),
    # a batch clip of 1 +- 0.01: R leaves it whenever the token log-ratios' mean is off 0 by more than 0.01
    acting_settings={"batch_epsilon": 0.01},
)
