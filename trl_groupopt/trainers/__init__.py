"""Drop-in `trl.GRPOTrainer` subclasses, one per method, and the shared base (imported on first use, PEP 562).

`base.py` is `GroupOptTrainer`, which overrides each TRL hook once and hands the work to helpers: the loss (`loss.py`),
whole-group batches (`batching.py`), the metric reduction (`metrics.py`), the energy capture (`energy.py`), the
mechanism report (`report.py`), the non-finite guard (`guard.py`), the run folder (`checkpointing.py`). Config side:
`config.py` and `schedule.py`. Each method's config and trainer are in `<method>.py`; the exported classes are the ones
the method specs (`trl_groupopt/methods/`) name.
"""

from .. import _lazy
from ..methods import SHIPPED

_EXPORTS = {name: module for spec in SHIPPED for name, module in spec.exports.items()}


def __getattr__(name: str):  # PEP 562: a name is imported on first access
    return _lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return _lazy.names(__name__, _EXPORTS)


__all__ = list(_EXPORTS)
