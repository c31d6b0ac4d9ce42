"""The supported TRL versions (1.15.x and 1.16.x, docs/trl-upgrade.md): what differs between them that the library
has to handle, and the CPU stand-in that lets CI's TRL 1.15.0 stage run on a CPU.

- TRL 1.15 computes every log-probability with a Triton kernel only; without Triton (PyTorch's CPU builds)
  `GroupOptTrainer` refuses at construction, naming the fix, instead of failing on TRL's `None.apply` mid-step.
- `tests/trl_cpu_kernel.py` (the plugin CI's TRL 1.15.0 stage loads) computes what TRL's kernel computes: checked here
  against TRL 1.16's own kernel, which has a torch path on the CPU.
"""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils

from tests.helpers import clone_model, method_trainer
from tests.trl_cpu_kernel import TorchChunkedLogProb
from trl_groupopt import METHODS

OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_construction_refuses_a_trl_without_its_log_prob_kernel(tmp_path, base_model, tokenizer, monkeypatch, name):
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", None)  # TRL 1.15.0 where Triton is not installed
    with pytest.raises(ValueError, match=r"Triton kernel only.*Install trl>=1\.16,<1\.17"):
        method_trainer(name, tmp_path, clone_model(base_model), tokenizer)


@pytest.mark.parametrize(
    ("softcap", "logit_scale", "with_bias"), [(None, 1.0, False), (30.0, 0.5, True)], ids=["plain", "softcap-bias"]
)
def test_cpu_stand_in_computes_what_trls_kernel_computes(softcap, logit_scale, with_bias):
    """Values and gradients (log-probs and entropy) of the stand-in equal TRL's `ChunkedLogProbFunction`'s."""
    kernel = trl_utils._ChunkedLogProbFunction
    if kernel is None or kernel is TorchChunkedLogProb:
        pytest.skip("this TRL has no log-prob kernel without Triton (TRL 1.15): nothing to compare the stand-in with")
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=generator, requires_grad=True)
    weight = torch.randn(101, 16, generator=generator, requires_grad=True)
    bias = torch.randn(101, generator=generator, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 101, (37,), generator=generator)
    upstream = torch.randn(37, generator=generator)
    results = []
    for function in (kernel, TorchChunkedLogProb):
        outputs = function.apply(hidden, weight, bias, targets, 0.7, 32, softcap, logit_scale, OUTPUTS)
        loss = (outputs[0] * upstream).sum() + outputs[1].sum()
        grads = torch.autograd.grad(loss, [p for p in (hidden, weight, bias) if p is not None])
        results.append((outputs, grads))
    (trl_outputs, trl_grads), (ours, our_grads) = results
    for name, expected, actual in zip(("log_probs", *OUTPUTS), trl_outputs, ours, strict=True):
        if expected.dtype == torch.bool:
            assert torch.equal(expected, actual), name
        else:
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=2e-5, msg=name)
    for expected, actual in zip(trl_grads, our_grads, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)


def test_cpu_stand_in_leaves_a_trl_with_its_kernel_alone(monkeypatch):
    """The plugin replaces only a missing kernel (TRL 1.15 without Triton); TRL 1.16's stays TRL's."""
    from tests import trl_cpu_kernel

    sentinel = object()
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", sentinel)
    trl_cpu_kernel.pytest_configure(None)
    assert trl_utils._ChunkedLogProbFunction is sentinel
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", None)
    trl_cpu_kernel.pytest_configure(None)
    assert trl_utils._ChunkedLogProbFunction is TorchChunkedLogProb
