"""DFPO (in-group re-weighting on GSPO) and GRPO-fix, its symmetric-clip mode (equations:
`trl_groupopt/methods/dfpo/objective.py`)."""

from dataclasses import replace

from ..mechanism import OFF_POLICY, Mechanism, Observed
from ..spec import MethodSpec, Paper

PAPER = Paper.arxiv(
    "ding2026design",
    "Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient Cancellation",
    "2604.13088",
    author="Fei Ding and Yongkang Zhang and Youwei Wang and Zijian Zeng",
    year=2026,
)

#: The `dfpo_transform` that selects GRPO-fix (App. H): `GRPOFixConfig`'s default; `DFPOTrainer` trains it too.
GRPO_FIX = "symmetric_clip"

#: The residuals within this fraction of GSPO's on the same batches: clipping, not the transform, decides the run.
CLIPPING_DOMINATED = 0.1


def clipping_verdict(observed: dict[str, float]) -> str | None:
    """DFPO's end-of-run verdict, on `CLIPPING_DOMINATED` (docs/dfpo.md, "Reading `dfpo/cancellation_residual`")."""
    ours, gspo = observed.get("cancellation residual"), observed.get("GSPO's weights on the same batches")
    if not isinstance(ours, float) or not isinstance(gspo, float) or gspo <= 0:
        return None
    if abs(ours - gspo) > CLIPPING_DOMINATED * gspo:
        return None
    return (
        f"The residual is within {CLIPPING_DOMINATED:.0%} of GSPO's: this run is clipping-dominated (the transform "
        "barely changed the shared-token gradient); widen epsilon / epsilon_high or use "
        "dfpo_orthogonal_over='unclipped' (docs/dfpo.md)."
    )


METHOD = MethodSpec(
    name="dfpo",
    trainer_class="trl_groupopt.methods.dfpo.trainer:DFPOTrainer",
    config_class="trl_groupopt.methods.dfpo.trainer:DFPOConfig",
    paper=PAPER,
    headline_metric="dfpo/shrink",
    summary="GSPO sequence ratios re-weighted inside each group to restore token-gradient cancellation",
    # DFPO acted when its transform re-weighted a group (shrink < 1, Eq. 87); quoted beside GSPO's cancellation
    # residual.
    mechanism=Mechanism(
        name="DFPO's in-group re-weighting",
        what="the transform re-weighted a group",
        keys=("dfpo/shrink",),
        acts=lambda shrink: shrink < 1 - 1e-9,
        observed=(
            Observed("cancellation residual", "dfpo/cancellation_residual", "mean"),
            Observed("GSPO's weights on the same batches", "dfpo/cancellation_residual_gspo", "mean"),
        ),
        inert="this run trained as GSPO (the transform was the identity)",
        verdict=clipping_verdict,
        hint="train off-policy (steps_per_generation > gradient_accumulation_steps, or num_iterations > 1): on-policy "
        "every sequence ratio is 1",
    ),
    acting_settings={},  # the defaults act: off-policy, sequence ratios differ within a group and the transform acts
    on_policy_equals="grpo",  # ratio 1, group-centred advantages: every transform keeps s = 1, GSPO's loss
)

GRPO_FIX_METHOD = MethodSpec(
    name="grpo_fix",
    trainer_class="trl_groupopt.methods.dfpo.trainer:GRPOFixTrainer",
    config_class="trl_groupopt.methods.dfpo.trainer:GRPOFixConfig",
    paper=replace(PAPER, section="App. H"),
    headline_metric="dfpo/sym_clip_ratio",
    summary="GRPO with the symmetric clip -A * clip(r, 0, 1 + epsilon_high) for both advantage signs (Eq. 80)",
    # GRPO-fix acted on a step when its symmetric clip removed a token (r > 1 + epsilon_high, either advantage sign).
    mechanism=Mechanism(
        name="GRPO-fix's symmetric clip",
        what="the symmetric clip removed a token",
        keys=("dfpo/sym_clip_ratio",),
        acts=lambda rate: rate > 0,
        observed=(Observed("share of tokens removed", "dfpo/sym_clip_ratio", "mean"),),
        inert="this run trained with the unclipped surrogate -A * r",
        hint=f"{OFF_POLICY} or lower epsilon_high",
    ),
    on_policy_equals="grpo",  # at r = 1 the symmetric clip is inactive: -A * r, value and gradient
    acting_settings={},  # the defaults act: epsilon_high 0.2 removes the tokens whose ratio exceeds 1.2
)
