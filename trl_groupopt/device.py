"""What the training device offers, asked without importing TRL (the CLI's defaults and the configs' bf16 read it)."""

from __future__ import annotations

__all__ = ["device_supports_bf16", "has_accelerator"]


def has_accelerator() -> bool:
    """Whether torch sees a device to train on other than the CPU (CUDA/ROCm, XPU or Apple MPS)."""
    import torch

    if torch.cuda.is_available():
        return True
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return True
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def device_supports_bf16(use_cpu: bool = False) -> bool:
    """Whether bf16 mixed precision is both supported and worthwhile here: an accelerator with bf16 (Ampere+ GPU,
    XPU, NPU...) that training will use. CPU bf16 is emulated and slower than fp32 on most CPUs, so it stays off."""
    from transformers.utils import is_torch_bf16_gpu_available

    return not use_cpu and is_torch_bf16_gpu_available()
