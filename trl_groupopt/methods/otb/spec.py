"""OTB: advantages from the optimal token baseline (equations: `trl_groupopt/methods/otb/objective.py`)."""

from ..mechanism import Mechanism, Observed
from ..spec import MethodSpec, Paper

METHOD = MethodSpec(
    name="otb",
    trainer_class="trl_groupopt.methods.otb.trainer:OTBTrainer",
    config_class="trl_groupopt.methods.otb.trainer:OTBConfig",
    paper=Paper.arxiv(
        "li2026optimal",
        "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL",
        "2602.07078",
        author="Yingru Li and Jiawei Xu and Ziniu Li and Jiacai Liu and Wei Liu and Yuxuan Tong and Longtao Zheng and Zhenghai Xue and Yaxiang Zhang and Tianle Cai and Ge Zhang and Qian Liu and Baoxiang Wang",
        year=2026,
    ),
    headline_metric="otb/grad_second_moment",
    summary="advantages G_i - b_t with the optimal token baseline from the logit-gradient energy",
    # OTB acted on a step when its token baseline gave a lower gradient second moment E[A^2 ||grad log p||^2] than the
    # group-mean baseline on the same tokens (its purpose: variance reduction, Theorem 4.1).
    mechanism=Mechanism(
        name="OTB's token baseline",
        what="its baseline's gradient second moment was below the group mean's",
        keys=("otb/grad_second_moment", "otb/grad_second_moment_group_mean_baseline"),
        acts=lambda ours, group_mean: ours < group_mean,
        observed=(
            Observed("gradient second moment", "otb/grad_second_moment", "mean"),
            Observed("the group-mean baseline's", "otb/grad_second_moment_group_mean_baseline", "mean"),
        ),
        inert="its advantages had no lower variance than the group-mean baseline's on any step",
        hint="use it where completions differ in length within a group (docs/otb.md)",
    ),
    acting_settings={},  # the defaults act wherever a group's completions differ in length
    # on the embedded policy (`trl-groupopt train --method otb`): OTB's advantages are raw rewards minus its token
    # baseline (no std normalisation); measured, lr 1e-4 left held-out accuracy flat (18.0% -> 17.5%) and 2e-4 / 3e-4
    # collapsed it, while 5e-5 gave 18.0% -> 34.5%
    demo_defaults={"learning_rate": 5e-5},
    on_policy_equals="grpo",  # the objective is TRL's; only the advantages change
    # OTB is the advantage estimator "otb": any objective on it reports this mechanism too
    estimator="trl_groupopt.methods.otb.objective:OTB_ESTIMATOR",
)
