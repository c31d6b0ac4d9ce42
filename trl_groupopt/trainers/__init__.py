"""Drop-in `trl.GRPOTrainer` subclasses, one per objective, and the shared base."""

from .base import GroupOptTrainer
from .ctpo import CTPOConfig, CTPOTrainer
from .dfpo import DFPOConfig, DFPOTrainer
from .echo import ECHOConfig, ECHOTrainer
from .otb import OTBConfig, OTBTrainer

__all__ = [
    "CTPOConfig", "CTPOTrainer", "DFPOConfig", "DFPOTrainer", "ECHOConfig", "ECHOTrainer", "GroupOptTrainer",
    "OTBConfig", "OTBTrainer",
]  # fmt: skip
