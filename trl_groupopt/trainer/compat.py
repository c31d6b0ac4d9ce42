"""A guard against stacks that would compute a loss other than `GroupOptTrainer._compute_loss` (Unsloth),
our own word in place of a TRL warning that would mislead a method's user (`dropping_trl_warning`), and the warnings
TRL 1.16 on transformers 5 raises that no user can act on, hidden while training (`stack_noise_hidden`)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

#: (message regex, category) of the warnings `stack_noise_hidden` hides: TRL 1.16 calls transformers 5's deprecated
#: `gradient_checkpointing_enable` / `_disable` / `is_gradient_checkpointing` (every generation), and transformers
#: asks the DataLoader to pin memory where there is no accelerator to pin it for.
STACK_NOISE = (
    (r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated", FutureWarning),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning),
)


def check_loss_routed_through_compute_loss(trainer_cls: type) -> None:
    """Raise if the installed stack would compute a loss other than our `_compute_loss`: Unsloth rebinds
    `trl.GRPOTrainer` and replaces `compute_loss` (in the supported TRL versions, Liger only patches model kernels)."""
    for klass in trainer_cls.__mro__:
        if "unsloth" in (klass.__module__ or "").lower() or "unsloth" in klass.__name__.lower():
            raise ValueError(
                f"{trainer_cls.__name__} derives from {klass.__module__}.{klass.__name__}: Unsloth's patched "
                "GRPOTrainer replaces `compute_loss`, which would silently train Unsloth's GRPO loss instead of this "
                "method's objective. Import trl_groupopt in a process that does not import unsloth (or import "
                "trl_groupopt before unsloth and do not use Unsloth's patched trainer)."
            )
    compute_loss_module = getattr(trainer_cls.compute_loss, "__module__", "") or ""
    if not compute_loss_module.startswith(("trl.", "trl_groupopt")):
        raise ValueError(
            f"{trainer_cls.__name__}.compute_loss comes from {compute_loss_module!r}, not TRL: something (e.g. "
            "Unsloth) patched the trainer and this method's objective would not be used. Remove the patch."
        )


@contextlib.contextmanager
def dropping_trl_warning(text: str | None) -> Iterator[list[logging.LogRecord]]:
    """Drop TRL's GRPO warnings containing `text` inside the block; yields the dropped records."""
    dropped: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if text is not None and text in record.getMessage():  # accelerate prefixes "[RANK k] "
            dropped.append(record)
            return False
        return True

    trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
    trl_logger.addFilter(keep)
    try:
        yield dropped
    finally:
        trl_logger.removeFilter(keep)


def check_trl_scores_tokens() -> None:
    """Raise if TRL's fused LM head has no kernel here: TRL 1.15 computes every log-probability with a Triton kernel
    only, so without Triton (PyTorch's CPU builds) its first loss would fail on `None.apply`. TRL 1.16 computes them
    in torch where Triton is missing."""
    import trl
    import trl.trainer.utils as trl_utils

    # mirrors trl.trainer.utils._ChunkedLogProbFunction (trl 1.15.0): None when its Triton import failed
    if trl_utils._ChunkedLogProbFunction is None:
        raise ValueError(
            f"TRL {trl.__version__} computes log-probabilities with a Triton kernel only, and Triton is not installed "
            "(PyTorch ships it with its CUDA builds for Linux): no GRPOTrainer can compute a loss on this machine. "
            "Install trl>=1.16,<1.17 (which computes them in torch without Triton), or run on a GPU machine with "
            "a CUDA build of torch."
        )


@contextlib.contextmanager
def stack_noise_hidden() -> Iterator[None]:
    """Within it, the warnings of :data:`STACK_NOISE` are not shown (the others are, as before)."""
    with warnings.catch_warnings():
        for message, category in STACK_NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
