"""Public: reward functions with TRL's signature (defined in `trl_groupopt/data/rewards.py`)."""

from .data.rewards import *  # noqa: F403
from .data.rewards import __all__  # noqa: F401
