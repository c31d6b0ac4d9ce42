"""OTB (advantages `G_i - b_t` from the optimal token baseline) on TRL's policy loss: the `"otb"` estimator
(`trl_groupopt/objectives/estimators.py`) with TRL's objective. Paper and registry entry: `trl_groupopt/methods/otb.py`;
equations: `trl_groupopt.objectives.otb`, docs/otb.md; the energy comes from TRL's own forwards (`energy.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..methods import otb
from ..objectives.common import check_positive
from .base import GroupOptTrainer
from .config import AdvantageEstimatorConfigMixin, TokenSafeConfigMixin


@dataclass(repr=False)
class OTBConfig(TokenSafeConfigMixin, AdvantageEstimatorConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`OTBTrainer`].

    Inherits every parameter of [`trl.GRPOConfig`]; the policy loss is TRL's (set by `loss_type`,
    `importance_sampling_level`, `epsilon`...), only the advantages change: `A_it = G_i - b_t` with the optimal token
    baseline `b_t` of the group (raw rewards, no std normalisation; `docs/otb.md`). This is `advantage_estimator="otb"`,
    which every method config offers: `ECHOConfig(advantage_estimator="otb")` is ECHO's objective on these advantages.

    The paper's claim: OTB with a group of N=4 matches a group-mean baseline with N=32; `benchmarks/sample_efficiency.py`
    tests it here (OTB N=4 against GRPO N=4 and N=16 at equal prompts).

    The defaults reproduce verl's two reference estimators with their own defaults: a single-turn batch (no
    `tool_mask`) gets `optimal_token_baseline` (no zero tail), a multi-turn tool-use batch (TRL's `tool_mask`, from
    `tools`, `environment_factory` or a `rollout_func`'s `env_mask`) gets `tir_optimal_token_baseline` (valid-token
    positions, zero tail on).

    Its own fields: `advantage_estimator` (fixed, `"otb"`), `scale_rewards` (`"none"`, as the reference: only TRL's
    logged advantages use it), and the estimator's knobs `otb_token_positions`, `otb_handle_zero_tail`
    (`AdvantageEstimatorConfigMixin`, shared by every method config, documents both; docs/otb.md).
    """

    advantage_estimator: str = field(default="otb", metadata={"help": "Fixed: 'otb' (OTB's advantages)."})
    scale_rewards: str = field(default="none", metadata={"help": "OTB uses raw rewards; as the reference, 'none'."})

    def __post_init__(self):
        # Checked before TRL's own post-init: a bad value fails at once, naming the field and the fix.
        if self.advantage_estimator != "otb":
            raise ValueError(
                f"OTBConfig: advantage_estimator must be 'otb' (OTB is TRL's objective on OTB's advantages), got "
                f"{self.advantage_estimator!r}; for TRL's advantages use GRPOConfig with GroupOptTrainer or GRPOTrainer."
            )
        try:
            check_positive(epsilon=self.epsilon)
            if self.epsilon_high is not None:
                check_positive(epsilon_high=self.epsilon_high)
        except ValueError as err:
            raise ValueError(
                f"OTBConfig: {err}. The surrogate clips the ratio to [1 - epsilon, 1 + epsilon_high]: use a positive "
                "value (TRL's default epsilon is 0.2; leave epsilon_high unset to use epsilon)."
            ) from None
        if self.delta is not None and not self.delta > 0:
            raise ValueError(f"OTBConfig: delta must be > 0 (the surrogate's upper clip, e.g. 1.5), got {self.delta}.")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                "OTBConfig: importance_sampling_level must be 'token' or 'sequence', "
                f"got {self.importance_sampling_level!r}."
            )
        if self.scale_rewards not in (True, False, "group", "batch", "none"):
            raise ValueError(
                f"OTBConfig: scale_rewards must be 'none' (OTB's default), 'group' or 'batch', got {self.scale_rewards!r}."
            )
        super().__post_init__()


class OTBTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with OTB advantages (optimal token baseline from the logit-gradient energy)."""

    method_spec = otb.METHOD
    config_class = OTBConfig
