"""Drop-in `trl.GRPOTrainer` subclasses, one per objective, and the shared base (imported on first use, PEP 562).

The base trainer is `GroupOptTrainer` (`base.py`), assembled from one mixin per concern: the loss path (`loss.py`),
what each micro-batch carries (`batching.py`), the metric reduction (`metrics.py`); its config side is in
`config.py` (every method config) and `schedule.py` (the off-policy schedule), its guards against stacks that would
bypass the loss in `compat.py`. Each method module (`echo.py`, `dfpo.py`, `ctpo.py`, `otb.py`) holds its config and
its trainer; its registry entry (paper, summary, headline metric) is `trl_groupopt/methods/<method>.py`.
"""

from .. import _lazy

_EXPORTS = {
    "GroupOptTrainer": ".base",
    **dict.fromkeys(("CTPOConfig", "CTPOTrainer"), ".ctpo"),
    **dict.fromkeys(("DFPOConfig", "DFPOTrainer"), ".dfpo"),
    **dict.fromkeys(("ECHOConfig", "ECHOTrainer"), ".echo"),
    **dict.fromkeys(("OTBConfig", "OTBTrainer"), ".otb"),
}


def __getattr__(name: str):  # PEP 562: a name is imported on first access
    return _lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return _lazy.names(__name__, _EXPORTS)


__all__ = list(_EXPORTS)
