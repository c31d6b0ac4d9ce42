"""The training runs the real-vLLM tests make: one registered method on the embedded policy, float32 throughout."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from trl_groupopt import get_method
from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

from ..helpers import cpu_config_kwargs, length_reward, tiny_dataset
from .engine import on_gpu

#: Each run: two rollouts of two optimizer steps each (`steps_per_generation=2`: a rollout's second step is off-policy).
ROLLOUTS = 2


def vllm_trainer(name: str, output_dir, peft_config=None, **overrides):
    """The registered method `name` on the embedded policy, generating with vLLM in colocate mode (`overrides` win)."""
    kwargs = cpu_config_kwargs(
        output_dir,
        use_cpu=not on_gpu(),
        bf16=False,  # float32 on the trainer side too: bf16 autocast alone makes TRL's logged gap ~2e-3 (docs/vllm.md)
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,  # GPU: leave room for training (ignored on CPU)
        per_device_train_batch_size=8,  # 2 groups of 4 per optimizer step
        steps_per_generation=2,
        max_steps=2 * ROLLOUTS,
        max_completion_length=48,  # the task's completions end by 46 tokens: lengths, so rewards, differ
        temperature=0.7,  # not 1: both sides must apply it the same way
        learning_rate=1e-4,  # the demo's: a stale engine is then ~0.8 behind after a rollout (checks.STALE_GAP: 1e-3)
    )
    kwargs.update(overrides)
    spec = get_method(name)
    return spec.trainer_class(
        EMBEDDED_POLICY_PATH,
        length_reward,  # dense: every group has a non-zero advantage, so every step moves the policy
        args=spec.make_config(**kwargs),
        train_dataset=tiny_dataset(32),
        processing_class=AutoTokenizer.from_pretrained(EMBEDDED_POLICY_PATH, local_files_only=True),
        peft_config=peft_config,
    )


def parameters(model) -> dict[str, torch.Tensor]:
    """A detached copy of every named parameter."""
    return {name: param.detach().clone() for name, param in model.named_parameters()}
