"""The non-finite guard: a diverging run stops before any non-finite weight is applied, saved or pushed (transformers
trains on through a NaN); see docs/reliability.md. The gradient norm is reduced over processes: every rank stops."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ..runfolder.checkpoints import newest_complete_checkpoint


class NonFiniteError(RuntimeError):
    """A NaN or inf loss or gradient norm, or weights holding one about to be saved."""


def guard_enabled(args: Any) -> bool:
    return bool(getattr(args, "nonfinite_guard", True))  # on for TRL's plain `GRPOConfig` too


def nonfinite_weights(named_tensors: Iterable[tuple[str, Tensor]]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or inf (one host sync for all of them)."""
    # FSDP2's DTensor: the process's own shard
    local = [(n, t.to_local() if hasattr(t, "to_local") else t) for n, t in named_tensors if isinstance(t, Tensor)]
    named = [(name, t) for name, t in local if t.is_floating_point() and t.numel()]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(t).all().to(named[0][1].device) for _, t in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


def _causes(args: Any) -> str:
    fp16 = " fp16 overflow (fp16=True: train in bf16 or fp32)," if getattr(args, "fp16", False) else ""
    return (
        f"Likely causes: a learning rate too high for this model (learning_rate={args.learning_rate}: try 10x lower),"
        f"{fp16} or rewards on a large scale (estimators without std normalisation use the raw rewards: "
        "bring them to order 1)."
    )


def _resume_hint(output_dir: str) -> str:
    last = newest_complete_checkpoint(output_dir, warn=False) if os.path.isdir(output_dir) else None
    if last is None:
        return "No checkpoint was saved before it."
    return (
        f"The last good checkpoint is {last}: fix the cause and resume from it (trainer.train("
        "resume_from_checkpoint=True), or --resume_from_checkpoint last on the command line)."
    )


def _stop(trainer, metric: str, value: Any) -> None:
    step = trainer.state.global_step + 1  # the optimizer step being computed
    raise NonFiniteError(
        f"Training diverged at step {step}: the {metric} is {value}, so the optimizer step was not applied. "
        f"{_causes(trainer.args)} {_resume_hint(trainer.args.output_dir)} (nonfinite_guard=False turns this check off.)"
    )


def check_loss(trainer, model, loss: Tensor) -> None:
    # GRPOTrainer.compute_loss refuses `return_outputs`: the loss is a tensor
    if model.training and guard_enabled(trainer.args) and not bool(torch.isfinite(loss.detach()).all()):
        _stop(trainer, "loss of a micro-batch", loss.detach().float().tolist())


def check_grad_norm(trainer, grad_norm) -> None:
    if grad_norm is not None and guard_enabled(trainer.args) and not math.isfinite(float(grad_norm)):
        _stop(trainer, "gradient norm", float(grad_norm))


def check_weights(trainer, state_dict, output_dir: str | None) -> None:
    if not guard_enabled(trainer.args):
        return
    bad = nonfinite_weights((state_dict if state_dict is not None else trainer.model.state_dict()).items())
    if bad:
        where = output_dir if output_dir is not None else trainer.args.output_dir
        raise NonFiniteError(
            f"Refusing to save weights that hold NaN or inf to {where}: {len(bad)} tensor(s), e.g. "
            f"{bad[:3]}. {_causes(trainer.args)} (nonfinite_guard=False saves them anyway.)"
        )
