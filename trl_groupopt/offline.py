"""Public: the synthetic task and the embedded tiny policy (defined in `trl_groupopt/data/offline.py`)."""

from .data.offline import *  # noqa: F403
from .data.offline import __all__  # noqa: F401
