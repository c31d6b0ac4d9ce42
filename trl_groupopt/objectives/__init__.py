"""The objectives and advantage estimators: pure torch. Importing the package imports each of its modules, so that
the estimators they register (OTB's, in `otb.py`) are in `estimators.ESTIMATORS` before one is looked up."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

for _module in pkgutil.iter_modules([str(Path(__file__).parent)]):  # `__path__`'s folder, also when run as a module
    importlib.import_module(f"{__package__}.{_module.name}")
