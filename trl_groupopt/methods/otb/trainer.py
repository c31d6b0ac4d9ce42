"""OTB: TRL's policy loss on the `"otb"` estimator's advantages (`trl_groupopt.methods.otb.objective`, docs/otb.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ...core.common import check_positive
from ...trainer.base import GroupOptTrainer
from ...trainer.config import AdvantageEstimatorConfigMixin, TokenSafeConfigMixin


@dataclass(repr=False)
class OTBConfig(TokenSafeConfigMixin, AdvantageEstimatorConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`OTBTrainer`]: every parameter of [`trl.GRPOConfig`]. The policy loss is TRL's; only the
    advantages change, `A_it = G_i - b_t` (`advantage_estimator="otb"`, fixed here and offered by every method
    config), on raw rewards (`scale_rewards="none"`, as the reference). The defaults reproduce verl's single-turn
    and tool-use estimators, each in its setting (docs/otb.md); the paper's N=4-matches-N=32 claim is tested by
    `benchmarks/stress.py` (the claims grid's `otb_small_group`, and `--sample-efficiency`).
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
            widths = {"epsilon": self.epsilon, "epsilon_high": self.epsilon_high}
            check_positive(**{name: value for name, value in widths.items() if value is not None})
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

    config_class = OTBConfig
