"""DFPO and GRPO-fix: configs and trainers. Equations: `trl_groupopt/methods/dfpo/objective.py`; docs/dfpo.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from trl import GRPOConfig

from ...core.common import Groups, ObjectiveOutput, check_choice, check_positive
from ...core.estimators import estimator_of
from ...trainer.base import GroupOptTrainer
from ...trainer.config import AdvantageEstimatorConfigMixin, TokenSafeConfigMixin
from .diagnostics import dfpo_diagnostics
from .grpo_fix import symmetric_clip_loss
from .objective import ORTHOGONAL_OVER, SUBSET_TRANSFORMS, TRANSFORMS, dfpo_loss
from .spec import GRPO_FIX

#: The opening words of TRL's warning (`GRPOTrainer.__init__`, trl 1.16.0) advising loss_type="grpo" with sequence-level
#: ratios: the opposite of DFPO's choice, so the trainer replaces it with `SUM_LOSS_NOTE` (formatted with its `args`).
TRL_SEQUENCE_LOSS_ADVICE = "When using `importance_sampling_level='sequence'`, the `'"
SUM_LOSS_NOTE = (
    "DFPOTrainer: loss_type={args.loss_type!r} with sequence-level ratios is deliberate: it weighs every token by one batch "
    "constant, so the gradients of a token shared by a group's completions cancel whatever their lengths; "
    "loss_type='grpo' (GSPO's recipe) would weigh sequence i by 1/|y_i| and lose that cancellation when the lengths "
    "differ (docs/dfpo.md)."
)

# GSPO's clip range (Zheng et al. 2025, Sec. 5.1); DFPO builds on GSPO and its paper sets no other value.
GSPO_EPSILON, GSPO_EPSILON_HIGH = 3e-4, 4e-4
# GRPO-fix clips only above (Eq. 80); TRL's GRPO default for that bound.
GRPO_FIX_EPSILON_HIGH = 0.2


@dataclass(repr=False)
class DFPOConfig(TokenSafeConfigMixin, AdvantageEstimatorConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`DFPOTrainer`]: every parameter of [`trl.GRPOConfig`], and DFPO's (App. B: in-group
    re-weighting of GSPO's ratios; `dfpo_transform="symmetric_clip"`: GRPO-fix, App. H). `epsilon` / `epsilon_high`
    default to GSPO's `3e-4` / `4e-4` (GRPO-fix: `0.2`); `importance_sampling_level` is fixed by the mode. What the
    transforms guarantee, and why per-token advantages and `loss_type="grpo"` break it: docs/dfpo.md.
    """

    dfpo_transform: str = field(
        default="min_replace",
        metadata={"help": "min_replace | orth_proj | orth_proj_qp | none (GSPO) | symmetric_clip (GRPO-fix)."},
    )
    dfpo_orth_floor: float = field(default=1e-6, metadata={"help": "Floor of the orth_proj weights (Eq. 52)."})
    dfpo_orthogonal_over: str = field(
        default="all",
        metadata={"help": "all (the paper's constraint) | unclipped (members carrying gradient; orth_proj(_qp))."},
    )
    epsilon: float | None = field(default=None, metadata={"help": "Lower clip; default GSPO's 3e-4."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clip; default 4e-4 (0.2 for GRPO-fix)."})
    importance_sampling_level: str | None = field(
        default=None, metadata={"help": "Fixed by dfpo_transform: 'sequence' (DFPO) or 'token' (GRPO-fix)."}
    )
    loss_type: str = field(
        default="dapo", metadata={"help": "Aggregation; 'dapo' keeps shared-token cancellation, 'grpo' breaks it."}
    )

    def __post_init__(self):
        check_choice("dfpo_transform", self.dfpo_transform, (*TRANSFORMS, GRPO_FIX))
        grpo_fix = self.dfpo_transform == GRPO_FIX
        if not grpo_fix and estimator_of(self).per_token:
            raise ValueError(
                f"dfpo_transform={self.dfpo_transform!r} does not take advantage_estimator={self.advantage_estimator!r}: "
                "DFPO's in-group transform makes sum_i A_i s_til_i = 0 with ONE advantage A_i per sequence, and these "
                "differ at every token (A_it): one weight per sequence cannot cancel them at every position "
                "(docs/dfpo.md, 'DFPO and per-token advantages'). Use dfpo_transform='symmetric_clip' (GRPO-fix, "
                "per-token) with it, or advantage_estimator='grpo' with DFPO's transforms."
            )
        level = "token" if grpo_fix else "sequence"
        if self.importance_sampling_level not in (None, level):
            raise ValueError(
                f"dfpo_transform={self.dfpo_transform!r} uses {level}-level ratios: leave importance_sampling_level "
                f"unset or set it to {level!r} (got {self.importance_sampling_level!r})."
            )
        self.importance_sampling_level = level
        if self.epsilon is None:
            self.epsilon = GRPO_FIX_EPSILON_HIGH if grpo_fix else GSPO_EPSILON
        if self.epsilon_high is None:
            self.epsilon_high = GRPO_FIX_EPSILON_HIGH if grpo_fix else GSPO_EPSILON_HIGH
        super().__post_init__()
        if grpo_fix:  # one clip, above (Eq. 80), and no in-group constraint
            check_positive(epsilon_high=self.epsilon_high, finite=True)
            if self.dfpo_orthogonal_over != "all":
                raise ValueError(
                    f"dfpo_orthogonal_over={self.dfpo_orthogonal_over!r} needs one of DFPO's in-group transforms, not "
                    "GRPO-fix (dfpo_transform='symmetric_clip', which clips each token on its own): leave it 'all'."
                )
            return
        check_positive(
            epsilon=self.epsilon, epsilon_high=self.epsilon_high, dfpo_orth_floor=self.dfpo_orth_floor, finite=True
        )
        check_choice("dfpo_orthogonal_over", self.dfpo_orthogonal_over, ORTHOGONAL_OVER)
        if self.dfpo_orthogonal_over == "unclipped" and self.dfpo_transform not in SUBSET_TRANSFORMS:
            raise ValueError(  # why "unclipped" needs a projection: docs/dfpo.md, Deviations
                "dfpo_orthogonal_over='unclipped' needs a transform that enforces sum_i A_i s_til_i = 0 over the "
                f"unclipped members of a group ({', '.join(SUBSET_TRANSFORMS)}), not dfpo_transform="
                f"{self.dfpo_transform!r} (min_replace only cancels when the advantages of those members sum to zero; "
                "'none' has no constraint). Use dfpo_transform='orth_proj' or 'orth_proj_qp', or "
                "dfpo_orthogonal_over='all'."
            )


class DFPOTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with DFPO's in-group re-weighted GSPO objective, or GRPO-fix's symmetric clip."""

    config_class = DFPOConfig
    supports_delta = False
    inert_on_policy = "DFPO's re-weighting (or GRPO-fix's clip) never acts"
    # dfpo_loss folds TRL's loss weights (vLLM IS weights, off-policy and entropy masks) into the in-group transform,
    # so the cancellation includes them; symmetric_clip_loss multiplies them as TRL does.
    objective_applies_token_weights = True
    # The transforms (and the asymmetry metrics, also under "none") look at whole groups; GRPO-fix does not.
    requires_whole_groups = staticmethod(lambda args: getattr(args, "dfpo_transform", "min_replace") != GRPO_FIX)
    replaces_trl_warning = (TRL_SEQUENCE_LOSS_ADVICE, SUM_LOSS_NOTE)  # TRL's advice would lose the cancellation

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any], *, token_weights: Tensor | None = None) -> ObjectiveOutput:  # fmt: skip
        inputs, args = (per_token_logps, old_per_token_logps, advantages, mask), self.args
        if args.dfpo_transform == GRPO_FIX:
            return symmetric_clip_loss(*inputs, epsilon_high=self.epsilon_high, importance_weights=token_weights)
        groups = Groups.contiguous(mask.shape[0], self.group_size)
        out = dfpo_loss(
            *inputs,
            groups,
            transform=args.dfpo_transform,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            orth_floor=args.dfpo_orth_floor,
            orthogonal_over=args.dfpo_orthogonal_over,
            importance_weights=token_weights,
        )
        out.metrics.update(dfpo_diagnostics(out.weights, self.loss_type))  # logged with this micro-batch's metrics
        return out


@dataclass(repr=False)
class GRPOFixConfig(DFPOConfig):
    r"""
    Configuration class for [`GRPOFixTrainer`]: [`DFPOConfig`] with `dfpo_transform="symmetric_clip"` by default,
    GRPO-fix (Ding et al., arXiv:2604.13088, App. H): the token ratio clipped to `[0, 1 + epsilon_high]` for both
    advantage signs (Eq. 80), `epsilon` / `epsilon_high` `0.2`, token-level ratios.
    """

    dfpo_transform: str = field(
        default=GRPO_FIX, metadata={"help": "symmetric_clip (GRPO-fix) only; DFPO's transforms: DFPOConfig."}
    )

    def __post_init__(self):
        if self.dfpo_transform != GRPO_FIX:  # issue 52: it trained DFPO under GRPO-fix's name (card, report)
            raise ValueError(
                f"GRPOFixConfig(dfpo_transform={self.dfpo_transform!r}) would train DFPO under GRPO-fix's name: "
                f"GRPO-fix is dfpo_transform={GRPO_FIX!r} (its default). For DFPO's transforms use DFPOConfig and "
                "DFPOTrainer (--method dfpo)."
            )
        super().__post_init__()


class GRPOFixTrainer(DFPOTrainer):
    """[`trl.GRPOTrainer`] with GRPO-fix's symmetric clip (`DFPOTrainer` on a [`GRPOFixConfig`])."""

    config_class = GRPOFixConfig
