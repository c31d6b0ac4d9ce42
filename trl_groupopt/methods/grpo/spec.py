"""GRPO, TRL's objective through the shared loss path: the baseline every method is compared with."""

from ..mechanism import OFF_POLICY, Mechanism, Observed
from ..spec import MethodSpec, Paper

METHOD = MethodSpec(
    name="grpo",
    trainer_class="trl_groupopt.trainer.base:GroupOptTrainer",
    paper=Paper.arxiv(
        "shao2024deepseekmath",
        "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
        "2402.03300",
        author="Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo",
        year=2024,
    ),
    headline_metric="clip_ratio/region_mean",
    summary="TRL's GRPO objective through the shared loss path (the baseline)",
    display_name="GRPO (trl-groupopt base)",
    # GRPO's clip acted when a token ratio (sequence ratio with importance_sampling_level="sequence") hit its bound.
    mechanism=Mechanism(
        name="GRPO's ratio clip",
        what="a token ratio was clipped",
        keys=("clip_ratio/region_mean",),
        acts=lambda rate: rate > 0,
        observed=(Observed("share of tokens clipped", "clip_ratio/region_mean", "mean"),),
        inert="this run trained as the unclipped policy gradient",
        hint=f"{OFF_POLICY} or lower epsilon / epsilon_high",
    ),
    on_policy_equals="grpo",  # it is TRL's clipped surrogate
    acting_settings={},  # the defaults act: TRL's epsilon 0.2 clips token log-ratios beyond about +-0.2
)
