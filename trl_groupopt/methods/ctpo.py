"""CTPO: cumulative prefix ratio with position-adaptive log-space clipping (`trl_groupopt/objectives/ctpo.py`)."""

from __future__ import annotations

import textwrap

from ..spec import MethodSpec, Paper

PAPER = Paper(
    title="Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective",
    arxiv_id="2605.07331",
    bibtex=textwrap.dedent("""\
        @article{zhang2026ctpo,
            title        = {{Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective}},
            author       = {Zhang and Ye and Jin and Yu and Xiong and Sahu and Jiang},
            year         = 2026,
            eprint       = {arXiv:2605.07331},
            howpublished = {\\url{https://github.com/horizon-llm/CTPO}},
        }"""),
)

METHOD = MethodSpec(
    name="ctpo",
    trainer_class="trl_groupopt.trainers.ctpo:CTPOTrainer",
    paper=PAPER,
    headline_metric="ctpo/dual_clip",
    summary="cumulative-prefix token ratio with position-adaptive log-space clipping",
)
