"""Drop-in `trl.GRPOTrainer` subclasses, one per method, and the shared base `GroupOptTrainer` (`base.py`); each
method's config and trainer are in `<method>.py`, exported as its spec names them (imported on first use, PEP 562)."""

from .. import _lazy
from ..methods import SHIPPED

_EXPORTS = {name: module for spec in SHIPPED for name, module in spec.exports.items()}

__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)  # PEP 562: a name is imported on first access
__all__ = list(_EXPORTS)
