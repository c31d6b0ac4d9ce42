"""Public: the data door's loading and the row adapters for `Dataset.map` (defined in `trl_groupopt/data/adapters.py`)."""

from .data.adapters import *  # noqa: F403
from .data.adapters import __all__  # noqa: F401
