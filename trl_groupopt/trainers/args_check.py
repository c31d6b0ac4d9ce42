"""The numeric options every trainer checks at construction (issue 38), the baseline's plain `GRPOConfig` included.

Each bad value raises a `ValueError` of one line naming the option, the value and the fix, instead of a
`ZeroDivisionError` at the first step (`num_iterations=0`), a run that silently does something else (`max_steps=-5`
trained by epochs, a negative `beta` rewards drifting from the reference, a NaN `max_grad_norm` turns every update
into NaN), or a failure at the first loss (a negative `epsilon`). A `save_steps` that would make a resume inexact
warns (`trl_groupopt.resume.inexact_resume_warning`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from ..resume import inexact_resume_warning

__all__ = ["check_numeric_args"]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _problems(args: Any) -> list[str]:
    """One line per option `args` cannot honour."""
    found = []
    num_iterations = getattr(args, "num_iterations", 1)
    if not isinstance(num_iterations, int) or num_iterations < 1:
        found.append(f"num_iterations={num_iterations}: it must be an integer >= 1 (optimizer passes per generated "
                     "batch); use 1 for on-policy training")  # fmt: skip
    beta = getattr(args, "beta", 0.0)
    if _number(beta) and not (math.isfinite(beta) and beta >= 0):
        found.append(f"beta={beta}: the KL penalty's weight must be a finite number >= 0; use 0 to turn it off")
    max_grad_norm = getattr(args, "max_grad_norm", None)
    if _number(max_grad_norm) and not (math.isfinite(max_grad_norm) and max_grad_norm >= 0):
        found.append(f"max_grad_norm={max_grad_norm}: it must be a finite number >= 0; use 0 to turn clipping off")
    max_steps = getattr(args, "max_steps", -1)
    if _number(max_steps) and max_steps < 0 and max_steps != -1:
        found.append(f"max_steps={max_steps}: use a positive number of steps, or -1 to train by num_train_epochs")
    for name in ("epsilon", "epsilon_high"):
        value = getattr(args, name, None)
        if _number(value) and not (math.isfinite(value) and value >= 0):
            found.append(f"{name}={value}: the clip range must be a finite number >= 0, e.g. 0.2")
    learning_rate = getattr(args, "learning_rate", 0.0)
    if _number(learning_rate) and not (math.isfinite(learning_rate) and learning_rate >= 0):
        found.append(f"learning_rate={learning_rate}: it must be a finite number >= 0, e.g. 1e-6")
    return found


def check_numeric_args(trainer_name: str, args: Any) -> None:
    """Raise one `ValueError` line per bad numeric option (see the module docstring); warn on an inexact resume."""
    problems = _problems(args)
    if problems:
        raise ValueError(f"{trainer_name}: " + "; ".join(problems) + ".")
    inexact = inexact_resume_warning(args)
    if inexact is not None:
        warnings.warn(inexact, UserWarning, stacklevel=3)
