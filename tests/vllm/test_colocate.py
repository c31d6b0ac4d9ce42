"""Every registered method trains with a real vLLM engine in colocate mode (`use_vllm=True, vllm_mode="colocate"`),
the way users run the library, on the embedded policy in float32.

Each run has two rollouts of two optimizer steps each (`steps_per_generation=2`, so the second step of a rollout is
off-policy). Around every weight sync, vLLM's logprobs of a fixed batch of prompts are compared with the trainer's
(`checks.SyncMonitor`); TRL's own logged importance-sampling ratio must then be 1 on the first step of each rollout.
A run whose sync is skipped must be caught by both checks.
"""

import pytest
import torch

from tests.selection import tested_methods

from .checks import (
    IS_RATIO_TOLERANCE,
    LOGPROB_TOLERANCE,
    STALE_GAP,
    SyncMonitor,
    assert_is_ratios_near_one,
    assert_synced,
    fixed_prompt_ids,
    logged_is_ratios,
    logprob_gap,
)
from .engine import SKIP_REASON, vllm_installed
from .runs import ROLLOUTS, parameters, vllm_trainer

pytestmark = pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON)  # marked vllm and slow by folder


@pytest.mark.parametrize("name", tested_methods())
def test_method_trains_with_a_synced_colocated_engine(name, vllm_shims, tmp_path):
    trainer = vllm_trainer(name, tmp_path)
    monitor = SyncMonitor(trainer, fixed_prompt_ids(trainer))
    initial = parameters(trainer.model)
    trainer.train()

    assert trainer.state.global_step == 2 * ROLLOUTS
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 * ROLLOUTS and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(initial[n], p) for n, p in trainer.model.named_parameters()), "nothing trained"
    assert_synced(monitor.records, ROLLOUTS)
    assert_is_ratios_near_one(trainer.state.log_history, ROLLOUTS)


def test_lora_adapter_is_merged_into_vllm_and_unmerged_after(vllm_shims, tmp_path):
    """TRL merges the adapter, pushes the merged weights and unmerges: vLLM's logprobs then equal the PEFT model's
    (and not the base model's, once the adapter has trained), and the base weights are what they were before."""
    from peft import LoraConfig

    base_changes: list[float] = []
    base_model_gaps: list[float] = []  # vLLM against the trainer with its adapter disabled

    def check_merge_and_unmerge(sync) -> None:
        base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
        sync()
        assert not any(getattr(module, "merged", False) for module in trainer.model.modules()), "left merged"
        after = dict(trainer.model.named_parameters())
        base_changes.append(max((after[n].detach() - p).abs().max().item() for n, p in base.items()))
        with trainer.model.disable_adapter():
            base_model_gaps.append(logprob_gap(trainer, prompt_ids))

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = vllm_trainer("grpo", tmp_path, peft_config=lora, learning_rate=1e-3)  # LoRA moves slower
    prompt_ids = fixed_prompt_ids(trainer)
    monitor = SyncMonitor(trainer, prompt_ids, around_sync=check_merge_and_unmerge)
    trainer.train()

    assert_synced(monitor.records, ROLLOUTS)
    assert base_model_gaps[-1] > STALE_GAP, "the trained adapter did not change vLLM's logprobs: was it merged?"
    assert max(base_changes) <= 1e-6, f"unmerging did not restore the base weights (max change {max(base_changes)})"


def test_a_skipped_weight_sync_is_caught(vllm_shims, tmp_path):
    """The same run with TRL's weight sync turned into a no-op: both checks must fail."""
    trainer = vllm_trainer("grpo", tmp_path)
    monitor = SyncMonitor(trainer, fixed_prompt_ids(trainer), skip_sync=True)
    trainer.train()

    with pytest.raises(AssertionError, match="vLLM does not generate from the trained policy"):
        assert_synced(monitor.records, ROLLOUTS)
    assert max(record.after for record in monitor.records) > 10 * LOGPROB_TOLERANCE
    with pytest.raises(AssertionError, match="importance-sampling ratio"):
        assert_is_ratios_near_one(trainer.state.log_history, ROLLOUTS)
    low, high = logged_is_ratios(trainer.state.log_history)[-1]
    assert high - low > IS_RATIO_TOLERANCE


def test_bf16_autocast_alone_opens_the_logged_gap(vllm_shims, tmp_path):
    """The cause of the float32 gap (docs/vllm.md): the same float32 engine and policy, with the trainer's forward
    under bf16 autocast (`bf16=True`), no longer matches vLLM, and TRL's IS ratio moves away from 1."""
    trainer = vllm_trainer("grpo", tmp_path, bf16=True, max_steps=2)
    monitor = SyncMonitor(trainer, fixed_prompt_ids(trainer))
    trainer.train()

    assert min(record.after for record in monitor.records) > 10 * LOGPROB_TOLERANCE
    (low, high), *_ = logged_is_ratios(trainer.state.log_history)
    assert high - low > IS_RATIO_TOLERANCE
