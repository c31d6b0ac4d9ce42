"""The numeric options every trainer checks at construction, a plain `GRPOConfig` included: one `ValueError` line
naming the option and the fix, instead of a `ZeroDivisionError` (`num_iterations=0`) or a run that silently does
something else (`max_steps=-5` trains by epochs, a NaN `max_grad_norm` makes every update NaN)."""

from __future__ import annotations

import math
import warnings
from typing import Any

from ..runfolder.resume import inexact_resume_warning


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: option -> the fix, for the options that must be finite and >= 0
_NON_NEGATIVE = {
    "beta": "the KL penalty's weight must be a finite number >= 0; use 0 to turn it off",
    "max_grad_norm": "it must be a finite number >= 0; use 0 to turn clipping off",
    "epsilon": "the clip range must be a finite number >= 0, e.g. 0.2",
    "epsilon_high": "the clip range must be a finite number >= 0, e.g. 0.2",
    "learning_rate": "it must be a finite number >= 0, e.g. 1e-6",
}


def check_numeric_args(trainer_name: str, args: Any) -> None:
    """Raise on the bad numeric options; warn on a `save_steps` that makes a resume inexact."""
    problems, iterations, max_steps = [], args.num_iterations, args.max_steps
    if not isinstance(iterations, int) or iterations < 1:
        problems.append(f"num_iterations={iterations}: it must be an integer >= 1 (optimizer passes per generated "
                        "batch); use 1 for on-policy training")  # fmt: skip
    if _number(max_steps) and max_steps < 0 and max_steps != -1:
        problems.append(f"max_steps={max_steps}: use a positive number of steps, or -1 to train by num_train_epochs")
    for name, fix in _NON_NEGATIVE.items():
        value = getattr(args, name)
        if _number(value) and not (math.isfinite(value) and value >= 0):
            problems.append(f"{name}={value}: {fix}")
    if problems:
        raise ValueError(f"{trainer_name}: " + "; ".join(problems) + ".")
    inexact = inexact_resume_warning(args)
    if inexact is not None:
        warnings.warn(inexact, UserWarning, stacklevel=3)
