"""trl-groupopt: four group RL objectives for LLM reasoning as drop-in TRL trainers.

    from trl_groupopt import ECHOConfig, ECHOTrainer   # instead of GRPOConfig, GRPOTrainer

ECHO (batch-level clip, token-level IS), DFPO (in-group re-weighting on GSPO; GRPO-fix), CTPO (cumulative prefix
ratio, sqrt(t) log-space clip) and OTB (optimal token baseline). The math lives in `trl_groupopt.objectives` as pure
torch functions; the trainers in `trl_groupopt.trainers` share one `_compute_loss`.

Every name below is imported on first use (PEP 562): `import trl_groupopt` and the registry import no TRL; a trainer
or config class imports TRL when it is first read.
"""

from . import _lazy
from .trainers import _EXPORTS as _TRAINER_EXPORTS

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("METHODS", "MethodSpec", "Paper", "get_method", "register_method"), ".registry"),
    **{name: ".trainers" + module for name, module in _TRAINER_EXPORTS.items()},
    "compare": ".compare",  # `trl-groupopt compare`'s Python twin
}


def __getattr__(name: str):  # PEP 562: a name is imported on first access
    return _lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return _lazy.names(__name__, _EXPORTS)


__all__ = [*_EXPORTS, "__version__"]
