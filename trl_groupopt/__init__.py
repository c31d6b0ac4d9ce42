"""trl-groupopt: four group RL objectives for LLM reasoning as drop-in TRL trainers.

    from trl_groupopt import ECHOConfig, ECHOTrainer   # instead of GRPOConfig, GRPOTrainer

ECHO (batch-level clip, token-level IS), DFPO (in-group re-weighting on GSPO; GRPO-fix), CTPO (cumulative prefix
ratio, sqrt(t) log-space clip) and OTB (optimal token baseline). The math lives in `trl_groupopt.objectives` as pure
torch functions; the trainers in `trl_groupopt.trainers` share one `_compute_loss`.
"""

from .registry import METHODS, MethodSpec, get_method, register_method
from .trainers import (  # importing the trainers registers them in METHODS
    CTPOConfig,
    CTPOTrainer,
    DFPOConfig,
    DFPOTrainer,
    ECHOConfig,
    ECHOTrainer,
    GroupOptTrainer,
    OTBConfig,
    OTBTrainer,
)

__version__ = "0.1.0"

__all__ = [
    "METHODS", "MethodSpec", "get_method", "register_method",
    "CTPOConfig", "CTPOTrainer", "DFPOConfig", "DFPOTrainer", "ECHOConfig", "ECHOTrainer", "GroupOptTrainer",
    "OTBConfig", "OTBTrainer", "__version__",
]  # fmt: skip
