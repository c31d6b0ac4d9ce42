"""The checks that a real vLLM engine generates from the trainer's policy.

- `SyncMonitor` wraps TRL's `VLLMGeneration.sync_weights` on one trainer and, around each sync, compares vLLM's
  logprobs of a fixed batch of prompts with the trainer's (`logprob_gap`);
- `assert_synced` and `assert_is_ratios_near_one` judge a finished run, from those records and from TRL's own logs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from trl.trainer.utils import pad

#: vLLM vs trainer on the same float32 weights (measured on CPU: <= 1.3e-5 at the sampled tokens).
LOGPROB_TOLERANCE = 1e-4
#: TRL's vLLM importance-sampling ratio exp(trainer - vLLM) on the first optimizer step of a rollout.
IS_RATIO_TOLERANCE = 1e-3
#: Before a sync that follows training, the engine must be measurably behind: otherwise the check could not fail.
STALE_GAP = 1e-3
#: TRL's logged IS ratio metrics (one value per generation batch).
IS_RATIO_KEYS = ("sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/max")


def fixed_prompt_ids(trainer, num_prompts: int = 4) -> list[list[int]]:
    """The first `num_prompts` training prompts, tokenized by TRL (chat template), of at least two lengths so that
    the trainer's forward left-pads them."""
    prompts = [trainer.train_dataset[i]["prompt"] for i in range(num_prompts)]
    prompt_ids = trainer._tokenize_prompts(prompts)[0]
    assert len({len(ids) for ids in prompt_ids}) > 1, "the fixed batch must exercise left padding"
    return prompt_ids


#: vLLM's side of a comparison: prompts -> (completion ids, the sampled tokens' logprobs), one completion per prompt.
Generate = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]]]]


def backend_generate(trainer) -> Generate:
    """Sampling through the trainer's own TRL vLLM backend (`VLLMGeneration.generate`, its sampling parameters)."""

    def generate(prompt_ids):
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(prompt_ids, None, num_generations=1)
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]

    return generate


def logprob_gap(trainer, prompt_ids: list[list[int]], generate: Generate | None = None) -> float:
    """Max |vLLM - trainer| log-probability over the tokens vLLM samples for `prompt_ids`.

    Both sides as TRL computes them during training: vLLM with `logprobs_mode="processed_logprobs"` (through
    `generate`, by default the trainer's TRL backend), so the temperature applies; the trainer through
    `_get_per_token_logps_and_entropies` (logits divided by the same temperature), prompts left-padded and completions
    right-padded as `_generate_and_score_completions` pads them.
    """
    completion_ids, sampled_logps = (generate or backend_generate(trainer))(prompt_ids)
    device, pad_id = trainer.accelerator.device, trainer.processing_class.pad_token_id

    def padded(rows, value, side, dtype=torch.long):
        return pad([torch.tensor(r, dtype=dtype) for r in rows], padding_value=value, padding_side=side).to(device)

    prompt, prompt_mask = padded(prompt_ids, pad_id, "left"), padded([[1] * len(p) for p in prompt_ids], 0, "left")
    completion = padded(completion_ids, pad_id, "right")
    completion_mask = padded([[1] * len(c) for c in completion_ids], 0, "right")
    vllm_logps = padded(sampled_logps, 0.0, "right", torch.float32)
    with torch.no_grad():
        trainer_logps = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([prompt, completion], dim=1),
            torch.cat([prompt_mask, completion_mask], dim=1),
            completion.size(1),
            batch_size=len(prompt_ids),
        )[0]
    return ((trainer_logps - vllm_logps).abs() * completion_mask).max().item()


@dataclass
class SyncRecord:
    """One weight sync: the vLLM-vs-trainer gap just before it and just after it."""

    before: float
    after: float


@dataclass
class SyncMonitor:
    """Measures `logprob_gap` before and after every `sync_weights` of `trainer`'s vLLM backend.

    `skip_sync=True` leaves the engine's weights alone (the broken run the checks must catch); `around_sync(sync)`
    may wrap the real sync with more checks (the LoRA test's base-weight check).
    """

    trainer: Any
    prompt_ids: list[list[int]]
    skip_sync: bool = False
    around_sync: Callable[[Callable[[], None]], None] | None = None
    records: list[SyncRecord] = field(default_factory=list)

    def __post_init__(self):
        backend = self.trainer.vllm_generation
        sync = backend.sync_weights

        def monitored_sync() -> None:
            before = logprob_gap(self.trainer, self.prompt_ids)
            if not self.skip_sync:
                (self.around_sync or (lambda real_sync: real_sync()))(sync)
            self.records.append(SyncRecord(before, logprob_gap(self.trainer, self.prompt_ids)))

        backend.sync_weights = monitored_sync  # TRL calls it on the instance, once per new optimizer step


def assert_synced(records: list[SyncRecord], rollouts: int) -> None:
    """One sync per rollout; after each, vLLM's logprobs equal the trainer's; before each sync that follows training,
    they did not (the policy moved, so a missing sync would have been caught)."""
    assert len(records) == rollouts, f"expected one weight sync per rollout ({rollouts}), got {len(records)}"
    for i, record in enumerate(records):
        assert record.after <= LOGPROB_TOLERANCE, (
            f"after weight sync {i}, vLLM's logprobs differ from the trainer's by {record.after:.3g} "
            f"(> {LOGPROB_TOLERANCE}): vLLM does not generate from the trained policy"
        )
    for i, record in enumerate(records[1:], start=1):
        assert record.before > STALE_GAP, (
            f"before weight sync {i} the engine was only {record.before:.3g} behind the trainer: the policy barely "
            "moved, so this run cannot tell a missing sync from a real one (raise the learning rate)"
        )


def logged_is_ratios(log_history: list[dict[str, float]]) -> list[tuple[float, float]]:
    """(min, max) of TRL's vLLM IS ratio for every logged step that generated (the first step of each rollout)."""
    return [tuple(entry[key] for key in IS_RATIO_KEYS) for entry in log_history if IS_RATIO_KEYS[0] in entry]


def assert_is_ratios_near_one(log_history: list[dict[str, float]], rollouts: int) -> None:
    """TRL logs one IS ratio range per rollout, and on a synced engine it is within IS_RATIO_TOLERANCE of 1."""
    ratios = logged_is_ratios(log_history)
    assert len(ratios) == rollouts, f"expected {rollouts} logged IS ratio ranges (logging_steps=1), got {ratios}"
    for step, (low, high) in enumerate(ratios):
        assert 1 - IS_RATIO_TOLERANCE <= low <= high <= 1 + IS_RATIO_TOLERANCE, (
            f"rollout {step}: TRL's vLLM importance-sampling ratio spans [{low:.6f}, {high:.6f}], not within "
            f"{IS_RATIO_TOLERANCE} of 1"
        )
