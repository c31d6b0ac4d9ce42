"""What the training device offers, asked without importing TRL (the CLI's defaults and the configs' bf16 read it)."""

from __future__ import annotations

__all__ = ["device_supports_bf16", "has_accelerator"]


def has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or torch.xpu.is_available() or torch.backends.mps.is_available()


def device_supports_bf16(use_cpu: bool = False) -> bool:
    """Whether training uses an accelerator with native bf16 (emulated bf16, CPU or pre-Ampere: slower than fp32)."""
    if use_cpu:
        return False
    import torch

    if torch.cuda.is_available():
        if torch.version.hip is not None:  # ROCm: torch answers for the hardware itself
            return torch.cuda.is_bf16_supported(including_emulation=False)
        # native bf16 from Ampere (8.0): below it torch emulates bf16 (slow) and vLLM refuses the dtype
        return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= 8
    from transformers.utils import is_torch_bf16_gpu_available

    return is_torch_bf16_gpu_available()
