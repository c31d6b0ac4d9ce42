"""bf16 by native support only: a CUDA GPU of compute capability >= 8.0 (Ampere), never torch's emulation.

`torch.cuda.is_bf16_supported()` defaults to `including_emulation=True`, so on Colab's T4 (sm_75) it answers True;
emulated bf16 is slow there and vLLM refuses the dtype below sm_80. The CUDA device properties are monkeypatched
(this machine has no GPU), with torch's emulation answer pinned to True as on a T4.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trl_groupopt.trainer.device import device_supports_bf16

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "trl_groupopt_colab.ipynb"


@pytest.fixture
def cuda_device(monkeypatch):
    """Pretend one CUDA GPU of the given (major, minor) compute capability is present."""

    def install(major: int, minor: int) -> None:
        props = SimpleNamespace(major=major, minor=minor, name=f"sm_{major}{minor}")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        # what torch answers on a T4: bf16 tensors can be created (emulation)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)

    return install


def _notebook_use_bf16_line() -> str:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    lines = [line for cell in cells if cell["cell_type"] == "code" for line in cell["source"]]
    (line,) = [line for line in lines if line.startswith("use_bf16 =")]
    return line


@pytest.mark.parametrize(("capability", "native"), [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bf16_only_with_native_support(cuda_device, capability, native):
    cuda_device(*capability)
    assert device_supports_bf16() is native
    assert device_supports_bf16(use_cpu=True) is False  # a CPU run never trains in bf16
    namespace = {"torch": torch}
    exec(_notebook_use_bf16_line(), namespace)  # the notebook's own choice agrees
    assert namespace["use_bf16"] is native


def test_no_gpu_no_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    namespace = {"torch": torch}
    exec(_notebook_use_bf16_line(), namespace)
    assert namespace["use_bf16"] is False
    if not torch.backends.mps.is_available():
        assert device_supports_bf16() is False
