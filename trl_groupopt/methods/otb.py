"""OTB: advantages from the optimal token baseline (equations: `trl_groupopt/objectives/otb.py`)."""

from __future__ import annotations

import textwrap

from ..spec import MethodSpec, Paper

PAPER = Paper(
    title="The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL",
    arxiv_id="2602.07078",
    bibtex=textwrap.dedent("""\
        @article{li2026optimal,
            title        = {{The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL}},
            author       = {Yingru Li and Jiawei Xu and Ziniu Li and Jiacai Liu and Wei Liu and Yuxuan Tong and Longtao Zheng and Zhenghai Xue and Yaxiang Zhang and Tianle Cai and Ge Zhang and Qian Liu and Baoxiang Wang},
            year         = 2026,
            eprint       = {arXiv:2602.07078},
        }"""),
)

METHOD = MethodSpec(
    name="otb",
    trainer_class="trl_groupopt.trainers.otb:OTBTrainer",
    paper=PAPER,
    headline_metric="otb/grad_second_moment",
    summary="advantages G_i - b_t with the optimal token baseline from the logit-gradient energy",
)
