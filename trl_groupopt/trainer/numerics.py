"""The forward's numerical noise, measured where it is free: on the first optimizer step of each rollout the policy
has not moved since TRL's behaviour forward, so the token log-ratios the loss sees there are noise. Logged as
``numerics/log_ratio_rms`` and ``numerics/noise_share/<window>`` (`trl_groupopt.core.numerics`); a warning, once
per run, when the noise is a large share of a clip window (docs/ctpo.md, docs/dfpo.md: "Numerical noise")."""

from __future__ import annotations

import warnings
from typing import Any

from torch import Tensor
from transformers import TrainerCallback

from ..core.numerics import ClipWindow, log_ratio_rms, noise_share, ratio_window_width
from .boundary import micro_step

#: The noise share (`noise_share`) above which the trainer warns: at 0.25, every clipped quantity lying within a
#: quarter of the half-width of its bound, one noise rms, may be clipped or not by rounding alone.
NOISE_WARNING_SHARE = 0.25
RMS_METRIC, SHARE_METRIC = "numerics/log_ratio_rms", "numerics/noise_share/"


def clip_windows(args: Any) -> tuple[ClipWindow, ...]:
    """The clips of a config's objective, against which the noise is measured: the config's own `clip_windows()`
    where its method defines one, else TRL's token clip (GSPO's sequence clip under importance_sampling_level=
    "sequence"), ``[1 - epsilon, 1 + epsilon_high]`` as `GRPOTrainer.__init__` (trl 1.16.0) resolves it."""
    own = getattr(args, "clip_windows", None)
    if own is not None:
        return tuple(own())
    level = "sequence" if args.importance_sampling_level == "sequence" else "token"
    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    width = ratio_window_width(args.epsilon, high)
    return (ClipWindow(f"{level}_clip", width, level),) if width > 0 else ()  # epsilon=0: no window to measure


def policy_unmoved(trainer: Any) -> bool:
    """Whether no optimizer step has run since the behaviour forward of the current micro-batch's rollout (training
    only; called once per training micro-batch, before its forward's log-ratios are read)."""
    # mirrors GRPOTrainer._prepare_inputs (trl 1.16.0): it generates (and runs the behaviour forward) at the micro-steps
    # where `_step % (steps_per_generation * num_iterations) == 0`; `state.global_step` moves at each optimizer step
    if micro_step(trainer) % (trainer.args.steps_per_generation * trainer.num_iterations) == 0:
        trainer._rollout_global_step = trainer.state.global_step
    return getattr(trainer, "_rollout_global_step", None) == trainer.state.global_step


def rollout_noise_metrics(trainer: Any, per_token_logps: Tensor, inputs: dict[str, Any], mask: Tensor) -> dict:
    """The noise metrics of a training micro-batch whose policy has not moved since TRL's behaviour forward (0-dim
    tensors, no host sync); empty elsewhere, and on-policy, where TRL runs no behaviour forward (the old log-probs
    are the loss forward's own: the ratio is exactly 1 and carries no noise)."""
    old = inputs.get("old_per_token_logps")
    if not trainer.model.training or old is None or not policy_unmoved(trainer):
        return {}
    log_ratio = per_token_logps.detach() - old  # (B, T)
    metrics = {RMS_METRIC: log_ratio_rms(log_ratio, mask)}
    for window in clip_windows(trainer.args):
        metrics[SHARE_METRIC + window.name] = noise_share(log_ratio, mask, window)
    return metrics


class NoiseWarningCallback(TrainerCallback):
    """Warns once per run when a logged ``numerics/noise_share/<window>`` exceeds `NOISE_WARNING_SHARE` (reads the
    logged values: no host sync of its own)."""

    def __init__(self, trainer_name: str, windows: tuple[ClipWindow, ...]) -> None:
        self.trainer_name, self.windows, self.warned = trainer_name, {w.name: w for w in windows}, False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.warned or not logs or not state.is_world_process_zero:  # one warning, from the main process
            return
        for name, window in self.windows.items():
            share = logs.get(SHARE_METRIC + name)
            if share is not None and share > NOISE_WARNING_SHARE:
                self.warned = True
                warnings.warn(
                    noise_warning(self.trainer_name, window, share, logs.get(RMS_METRIC)), UserWarning, stacklevel=2
                )
                return


def noise_warning(trainer_name: str, window: ClipWindow, share: float, rms: float | None) -> str:
    """The warning's one line: what was measured, what it means, what helps."""
    measured = f" (token log-ratio rms {rms:.3g})" if rms is not None else ""
    return (
        f"{trainer_name}: on the first optimizer step of a rollout, where the policy has not moved, the forward's "
        f"numerical noise{measured} is {share:.3g} times the {window.name.replace('_', ' ')}'s half-width "
        f"{window.width:.3g} ({SHARE_METRIC}{window.name}): clip decisions follow rounding, not the policy's change. "
        "What helps: the same batch layout in the behaviour and loss forwards (TRL's default; padding-free, packed or "
        "re-padded batches add noise), fp32 (bf16 autocast over fp32 weights helps less), or a wider epsilon / "
        "epsilon_high (docs/ctpo.md, docs/dfpo.md: 'Numerical noise')."
    )
