"""trl-groupopt: group RL objectives for LLM reasoning as drop-in TRL trainers (`from trl_groupopt import ECHOConfig,
ECHOTrainer` instead of GRPOConfig, GRPOTrainer). Names are imported on first use (PEP 562): no TRL at import."""

from . import _lazy
from .trainers import _EXPORTS as _TRAINER_EXPORTS

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("METHODS", "MethodSpec", "Paper", "get_method", "register_method"), ".registry"),
    **_TRAINER_EXPORTS,
    "compare": ".compare",  # `trl-groupopt compare`'s Python twin
}

__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)  # PEP 562: a name is imported on first access
__all__ = [*_EXPORTS, "__version__"]
