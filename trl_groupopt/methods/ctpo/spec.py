"""CTPO: cumulative prefix ratio with position-adaptive log-space clipping (`trl_groupopt/methods/ctpo/objective.py`)."""

from ..mechanism import OFF_POLICY, Mechanism, Observed
from ..spec import MethodSpec, Paper

METHOD = MethodSpec(
    name="ctpo",
    trainer_class="trl_groupopt.methods.ctpo.trainer:CTPOTrainer",
    config_class="trl_groupopt.methods.ctpo.trainer:CTPOConfig",
    paper=Paper.arxiv(
        "zhang2026ctpo",
        "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective",
        "2605.07331",
        author="Zhang and Ye and Jin and Yu and Xiong and Sahu and Jiang",
        year=2026,
        howpublished=r"{\url{https://github.com/horizon-llm/CTPO}}",
    ),
    headline_metric="ctpo/dual_clip",
    summary="cumulative-prefix token ratio with position-adaptive log-space clipping",
    # CTPO acted on a step when a cumulative prefix ratio hit its position-scaled log-space clip, or its dual clip
    # bound a negative-advantage token's loss (Eq. 12-13: both are CTPO's clipping).
    mechanism=Mechanism(
        name="CTPO's prefix-ratio clip",
        what="a prefix ratio was clipped or the dual clip bound",
        keys=("clip_ratio/region_mean", "ctpo/dual_clip"),
        acts=lambda region, dual: region > 0 or dual > 0,
        observed=(
            Observed("share of tokens clipped", "clip_ratio/region_mean", "mean"),
            Observed("share of tokens dual-clipped", "ctpo/dual_clip", "mean"),
        ),  # fmt: skip
        inert="this run trained with CTPO's cumulative ratio, never clipped (nor dual-clipped)",
        hint=f"{OFF_POLICY} or lower epsilon / epsilon_high (log-space bounds per unit of t**p)",
    ),
    on_policy_equals="grpo",  # on-policy every prefix ratio is 1: token-level GRPO (docs/ctpo.md)
    acting_settings={},  # the defaults act: prefix ratios compound, so log-ratios of 0.3 leave the log-space bounds
)
