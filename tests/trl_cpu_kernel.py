"""pytest plugin for CI's TRL 1.15.0 stage (`.ci/run`, `-p tests.trl_cpu_kernel`): a plain-torch stand-in for TRL's
fused-LM-head kernel where TRL has none.

TRL 1.15's `add_fused_lm_head` (every `GRPOTrainer` forward that scores tokens) calls `ChunkedLogProbFunction`, which
is a Triton kernel only: without Triton (PyTorch's CPU builds) `trl.trainer.utils._ChunkedLogProbFunction` is None and
the first loss fails. TRL 1.16 folds the same tiles in torch on such devices. This plugin puts that maths back, in
plain torch with autograd (the whole `[N, V]` logits at once: the test models are tiny), so TRL 1.15.0's trainer and
ours run unchanged on CI's CPU. Both sides of every parity test go through the same stand-in. Where TRL has its
kernel (TRL 1.16, or any TRL with Triton) the plugin does nothing.
"""

from __future__ import annotations

import torch


class TorchChunkedLogProb:
    """`trl.kernels.ChunkedLogProbFunction.apply` (trl 1.15.0/1.16.0) in plain torch: the same arguments and the same
    five outputs (log-probs, entropy, log sum_v p_v^2, mean logit, target is the first argmax; None where not asked),
    the last three without gradient."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0, outputs=()):
        del chunk_size  # no tiles
        device = hidden.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        logits = hidden.to(dtype) @ weight.to(dtype).t()
        if bias is not None:
            logits = logits + bias.to(dtype)
        z = logits.float() * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        z = z / temperature
        log_z = torch.logsumexp(z, dim=-1)
        log_p = z - log_z.unsqueeze(-1)
        log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1) if "entropy" in outputs else None
        with torch.no_grad():
            log_sum_sq = torch.logsumexp(2 * log_p, dim=-1) if "log_sum_sq_probs" in outputs else None
            mean_logits = z.mean(-1) if "mean_logits" in outputs else None
            is_top1 = z.argmax(-1) == targets if "is_top1" in outputs else None
        return log_probs, entropy, log_sum_sq, mean_logits, is_top1


def pytest_configure(config) -> None:
    import trl.trainer.utils as trl_utils

    if trl_utils._ChunkedLogProbFunction is None:
        trl_utils._ChunkedLogProbFunction = TorchChunkedLogProb
