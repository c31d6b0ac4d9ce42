"""Drop-in `trl.GRPOTrainer` subclasses, one per method, and the shared base `GroupOptTrainer` (`base.py`); each
method's config and trainer are in `<method>.py`, exported as its spec names them (imported on first use, PEP 562)."""

from .. import _lazy
from ..methods import SHIPPED

_EXPORTS = {name: module for spec in SHIPPED for name, module in spec.exports.items()}


def __getattr__(name: str):  # PEP 562: a name is imported on first access
    return _lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return _lazy.names(__name__, _EXPORTS)


__all__ = list(_EXPORTS)
