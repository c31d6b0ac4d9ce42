"""ECHO: batch-level clipping with token-level importance sampling (equations: `trl_groupopt/objectives/echo.py`)."""

from __future__ import annotations

import textwrap

from ..spec import MethodSpec, Paper

PAPER = Paper(
    title="ECHO: Efficient Coarse-grained Hybrid Optimization - Clip at Batch, Learn at Token",
    arxiv_id=None,  # a preprint under double-blind review
    bibtex=textwrap.dedent("""\
        @misc{echo2025,
            title        = {{ECHO: Efficient Coarse-grained Hybrid Optimization - Clip at Batch, Learn at Token}},
            author       = {Anonymous},
            year         = 2025,
            note         = {Paper under double-blind review},
        }"""),
)

METHOD = MethodSpec(
    name="echo",
    trainer_class="trl_groupopt.trainers.echo:ECHOTrainer",
    paper=PAPER,
    headline_metric="echo/batch_clipped",
    summary="token ratios times clip(R)/sg(R), R the geometric batch ratio",
)
