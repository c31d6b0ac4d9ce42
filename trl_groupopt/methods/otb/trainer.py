"""OTB: TRL's policy loss on the `"otb"` estimator's advantages (`trl_groupopt.methods.otb.objective`, docs/otb.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

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
        # OTB's one rule; TRL's settings are checked where GRPOTrainer's are (epsilon: trainer/args_check.py).
        if self.advantage_estimator != "otb":
            raise ValueError(
                f"OTBConfig: advantage_estimator must be 'otb' (OTB is TRL's objective on OTB's advantages), got "
                f"{self.advantage_estimator!r}; for TRL's advantages use GRPOConfig with GroupOptTrainer or GRPOTrainer."
            )
        super().__post_init__()


class OTBTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with OTB advantages (optimal token baseline from the logit-gradient energy)."""

    config_class = OTBConfig
