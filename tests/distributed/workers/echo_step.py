"""Worker: one optimizer step of ECHO with gradient accumulation (2 micro-batches per process) on a FIXED batch.

Run on 1 process (micro-batches of 8 rows) and on 2 processes (micro-batches of 4 rows): the 16 rows of
`tests.distributed.batches.group_batch` form one optimizer step either way, but TRL shuffles the rows of the
generation batch, so the micro-batches hold different rows. With `batch_ratio_scope="step"` R and the gradient are
those of the objective over all 16 rows, whatever the split; with "micro_batch" they depend on it. The batch and the
behaviour log-probs are fixed as in `one_step.py` (whose patched generation this worker reuses). "step_weighted" is
"step" with TRL's per-sequence and per-token loss multipliers on: the off-policy mask and vLLM IS weights
(`token_mask` mode, from fixed sampling log-probs), which do not depend on the split either.

The step is the rollout's first (micro-steps 0-1 of 2), which "step" trains without the extra forward on the premise
that the behaviour policy is the current one (docs/echo.md). The fixed log-ratios make another behaviour policy, so
these cases run with the forward (`forward_forced`); "step_first" and "step_first_forward" take the current
log-probs as the behaviour ones (log-ratio 0, the premise), with the shortcut and with the forward.

Writes `rank{R}.json` ({"world_size", "cases": {scope: {"batch_ratio": [...]}}}) and `rank{R}_tensors.pt`
({scope: {"grads"}}: the all-reduced gradients entering the optimizer).
"""

import argparse
import contextlib
import os
import sys
from unittest import mock

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

import trl  # noqa: E402
from transformers import set_seed  # noqa: E402

from tests.distributed import batches  # noqa: E402
from tests.distributed.harness import write_result  # noqa: E402
from tests.distributed.workers.one_step import GradRecorder, fixed_generation  # noqa: E402
from tests.helpers import _forward, cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402
from trl_groupopt import ECHOConfig, ECHOTrainer  # noqa: E402

# case -> (batch_ratio_scope, the fixed log-ratios' scenario or None (the current log-probs), the forward forced)
CASES = {
    "step": ("step", "split", True),
    "micro_batch": ("micro_batch", "split", True),
    "step_weighted": ("step", "split", True),
    "step_first": ("step", None, False),
    "step_first_forward": ("step", None, True),
}
OFF_POLICY_THRESHOLD = 0.02  # masks the negative-advantage rows of the "split" half with log-ratio -0.3
IS_CLIP_MAX, SAMPLING_NOISE = 3.0, 0.6  # TRL's default clip; sampling log-probs 0.6 off the behaviour policy


def vllm_fields(old, mask):
    """Fixed vLLM sampling log-probs and TRL's `token_mask` IS ratio from them (mirrors
    `GRPOTrainer._generate_and_score_completions`, trl 1.16.0), over the whole global batch."""
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(5))
    sampling = old + SAMPLING_NOISE * noise * mask
    ratio = torch.exp((old - sampling) * mask)
    ratio = ratio.masked_fill(ratio > IS_CLIP_MAX, 0.0)
    assert bool((ratio[mask.bool()] == 0).any())  # some tokens masked
    return {"sampling_per_token_logps": sampling, "importance_sampling_ratio": ratio}


@contextlib.contextmanager
def forward_forced(forced: bool):
    """The step totals from the extra forward on every step (the first step's shortcut off), where `forced`."""
    if not forced:
        yield
        return
    with mock.patch.object(ECHOTrainer, "_why_step_totals_need_a_forward", lambda self, batches: "forced"):
        yield


def run_scope(case, cli, tokenizer, batch):
    scope, scenario, forced = CASES[case]
    world = cli.world_size
    args = ECHOConfig(
        **cpu_config_kwargs(
            os.path.join(cli.out, "run", case),
            per_device_train_batch_size=batches.NUM_ROWS // (2 * world),
            num_generations=batches.GROUP_SIZE,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            max_steps=1,
            max_completion_length=batches.COMPLETION_LEN,
            optim="sgd",
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=1e9,
            batch_ratio_scope=scope,
            off_policy_mask_threshold=OFF_POLICY_THRESHOLD if case == "step_weighted" else None,
        )
    )
    trainer = ECHOTrainer(
        tiny_model(tokenizer, seed=1), length_reward, args=args, train_dataset=tiny_dataset(16),
        processing_class=tokenizer,
    )  # fmt: skip
    assert trainer.accelerator.num_processes == world
    with torch.no_grad():  # initial log-probs over the whole global batch, identical on every rank
        logps, _, _ = _forward(trainer, trainer.model, batch)
    old = (logps - (0.0 if scenario is None else batches.log_ratios(scenario))).detach()
    trainer._fixed = {"batch": batch, "old_per_token_logps": old}
    if case == "step_weighted":  # as TRL sets them with use_vllm=True (generation is fixed: no engine needed)
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        trainer._fixed.update(vllm_fields(old, batch["completion_mask"].float()))
    recorder = GradRecorder()
    trainer.add_callback(recorder)
    set_seed(0)
    with forward_forced(forced):
        trainer.train()
    ratios = [entry["echo/batch_ratio"] for entry in trainer.state.log_history if "echo/batch_ratio" in entry]
    return {"batch_ratio": ratios}, {"grads": recorder.grads}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    cli = parser.parse_args()
    trl.GRPOTrainer._generate_and_score_completions = fixed_generation  # the parent of our base's override
    tokenizer = tiny_tokenizer()
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    results, tensors = {}, {}
    for case in CASES:
        results[case], tensors[case] = run_scope(case, cli, tokenizer, batch)
    rank = int(os.environ.get("RANK", "0"))
    torch.save(tensors, os.path.join(cli.out, f"rank{rank}_tensors.pt"))
    write_result(cli.out, {"world_size": cli.world_size, "cases": results})


if __name__ == "__main__":
    main()
