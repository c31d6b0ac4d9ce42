"""DFPO (in-group re-weighting on GSPO) and its GRPO-fix mode (equations: `trl_groupopt/objectives/dfpo.py`)."""

from __future__ import annotations

import textwrap
from dataclasses import replace

from ..spec import MethodSpec, Paper

PAPER = Paper(
    title="Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient Cancellation",
    arxiv_id="2604.13088",
    bibtex=textwrap.dedent("""\
        @article{ding2026design,
            title        = {{Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient Cancellation}},
            author       = {Fei Ding and Yongkang Zhang and Youwei Wang and Zijian Zeng},
            year         = 2026,
            eprint       = {arXiv:2604.13088},
        }"""),
)

#: The `dfpo_transform` that selects GRPO-fix (App. H): a mode of the DFPO trainer.
GRPO_FIX = "symmetric_clip"

METHOD = MethodSpec(
    name="dfpo",
    trainer_class="trl_groupopt.trainers.dfpo:DFPOTrainer",
    paper=PAPER,
    headline_metric="dfpo/shrink",
    summary="GSPO sequence ratios re-weighted inside each group to restore token-gradient cancellation",
)

#: GRPO-fix: the DFPO trainer in its symmetric-clip mode.
GRPO_FIX_METHOD = MethodSpec(
    name="grpo_fix",
    trainer_class="trl_groupopt.trainers.dfpo:DFPOTrainer",
    paper=replace(PAPER, section="App. H"),
    headline_metric="dfpo/sym_clip_ratio",
    config_defaults={"dfpo_transform": GRPO_FIX},
    summary="GRPO with the symmetric clip -A * clip(r, 0, 1 + epsilon_high) for both advantage signs (Eq. 80)",
)
