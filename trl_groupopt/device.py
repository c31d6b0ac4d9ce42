"""What the training device offers, asked without importing TRL (the CLI's defaults and the configs' bf16 read it)."""

from __future__ import annotations

__all__ = ["NATIVE_BF16_MIN_CAPABILITY", "device_supports_bf16", "has_accelerator"]

#: CUDA compute capability from which bf16 runs natively (Ampere, sm_80). Below it (e.g. Colab's T4, sm_75) torch
#: emulates bf16 (`torch.cuda.is_bf16_supported()` defaults to `including_emulation=True`), which is slow, and vLLM
#: refuses the dtype.
NATIVE_BF16_MIN_CAPABILITY = 8


def has_accelerator() -> bool:
    """Whether torch sees a device to train on other than the CPU (CUDA/ROCm, XPU or Apple MPS)."""
    import torch

    if torch.cuda.is_available():
        return True
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return True
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def device_supports_bf16(use_cpu: bool = False) -> bool:
    """Whether bf16 mixed precision is native and worthwhile here: an accelerator that runs bf16 in hardware (an
    NVIDIA GPU of compute capability >= 8.0, ROCm, XPU, NPU...) that training will use. Emulated bf16 does not count:
    CPU bf16 is slower than fp32 on most CPUs, and a pre-Ampere GPU (T4, V100) emulates it."""
    if use_cpu:
        return False
    import torch

    if torch.cuda.is_available():
        if torch.version.hip is not None:  # ROCm: torch answers for the hardware itself
            return torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= NATIVE_BF16_MIN_CAPABILITY
    from transformers.utils import is_torch_bf16_gpu_available

    return is_torch_bf16_gpu_available()
