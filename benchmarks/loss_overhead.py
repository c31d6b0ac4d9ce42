"""Loss-level overhead: each method's advantages + objective + backward against TRL's clipped surrogate, on one batch.

What is timed. One micro-batch of real shapes (`--batch-size` sequences of up to `--length` completion tokens,
groups of `--num-generations`) is scored once by each trainer of `benchmarks.overhead.variants()` (the task-sized
model, the fixed random completions of the overhead benchmark), so every trainer gets the batch fields it reads
(`group_ids`, raw rewards, OTB's behaviour energy, ...). The current log-probs are the behaviour log-probs plus a
fixed small drift (off-policy, so clipping acts), a leaf tensor. One *call* of a trainer is what its
`_compute_loss` does between the forward and the optimizer: `compute_advantages`, the `objective` hook, TRL's
"dapo" aggregation, backward to the log-probs; the model is in eval mode (ECHO's "step" scope then reduces the
micro-batch's own totals: the extra forward it needs in training is the step benchmark's business). The baseline,
`trl_grpo`, is the clipped surrogate exactly as `GRPOTrainer._compute_loss` computes it; `trl_grpo_again` is the same
function timed a second time, the A/A control.

How. Rounds: every trainer once, in an order rotated by one every round; a sample is `--reps` calls back to back,
timed with CUDA events on a GPU (the stream drained before each sample, so host syncs show as idle gaps) and the CPU
clock otherwise. The ratio of a trainer is the robust mean over rounds of log(sample / the baseline's same round),
as `benchmarks.overhead.ratio_estimate`; the noise floor is how far from 1 the control's 95% interval reaches.
Rounds go on until the floor is below `--noise-target` (after `--min-rounds`) or `--max-seconds` is spent.

Usage (from the repo root):
    python -m benchmarks.loss_overhead --device cpu            # the committed CPU table (loss_overhead_cpu.*)
    python -m benchmarks.loss_overhead --device cuda           # GPU, < 1 min
    python -m benchmarks.loss_overhead --smoke --output-dir outputs/bench
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from . import common, overhead

BASELINE, CONTROL = overhead.BASELINE, overhead.CONTROL


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--smoke", action="store_true", help="Short CPU run (a few seconds of rounds).")
    parser.add_argument("--batch-size", type=int, default=8, help="Sequences in the micro-batch.")
    parser.add_argument("--num-generations", type=int, default=4, help="Group size G.")
    parser.add_argument("--length", type=int, default=512, help="Completion length (tokens).")
    parser.add_argument("--reps", type=int, default=10, help="Calls per timed sample.")
    parser.add_argument("--min-rounds", type=int, default=30)
    parser.add_argument("--max-seconds", type=float, help="Timing budget (default: 40 on CUDA, 150 on CPU).")
    parser.add_argument("--noise-target", type=float, default=0.01, help="Stop once the A/A floor is below this.")
    parser.add_argument("--trainers", help="Comma-separated subset of the variant names (default: all).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    if args.smoke:
        args.device, args.length, args.reps, args.min_rounds = "cpu", 64, 2, 5
        args.max_seconds = args.max_seconds or 5.0
    if args.batch_size % args.num_generations:
        parser.error("--batch-size must be a multiple of --num-generations")
    return args


def trl_surrogate(per_token_logps, old_per_token_logps, advantages, epsilon_low: float, epsilon_high: float):
    """(B, T) per-token loss of TRL's default objective (token-level ratio, clipped surrogate, no delta)."""
    import torch

    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): importance_sampling_level "token", loss_type "dapo" surrogate
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def dapo_aggregate(per_token_loss, mask, inputs):
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): loss_type "dapo", one process, one micro-batch per generation
    return (per_token_loss * mask).sum() / inputs["num_items_in_batch"].clamp(min=1.0)


def scored_batch(trainer, dataset, args, device: str) -> dict[str, Any]:
    """The trainer's own batch fields for the first micro-batch of one generation batch (fake sampler)."""
    import torch

    n_rows = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    rows = [dataset[i // args.num_generations] for i in range(n_rows)]  # whole groups, as TRL's RepeatSampler
    trainer.model.train()
    with torch.no_grad():
        full = trainer._generate_and_score_completions(rows)
    trainer.model.eval()
    n = args.batch_size
    return {k: (v[:n].to(device) if torch.is_tensor(v) and v.dim() and v.shape[0] == len(rows) else v)
            for k, v in full.items()}  # fmt: skip


def make_call(trainer, inputs: dict[str, Any], drift):
    """One loss + backward of `trainer` (None: TRL's surrogate) on `inputs`; returns a zero-argument callable."""

    old = inputs["old_per_token_logps"].float()
    mask = inputs["completion_mask"]
    logps = (old + drift).detach().requires_grad_(True)

    if trainer is None:
        eps_low = eps_high = 0.2  # GRPOConfig's defaults (epsilon=0.2, epsilon_high=None -> epsilon)

        def call() -> None:
            dapo_aggregate(trl_surrogate(logps, old, inputs["advantages"], eps_low, eps_high), mask, inputs).backward()
            logps.grad = None

        return call
    kwargs = {"loss_weights": None} if trainer.objective_applies_loss_weights else {}

    def call() -> None:
        with trainer._metrics_discarded():  # queued metrics are flushed by _compute_loss, which is not called here
            advantages = trainer.compute_advantages(inputs, logps, mask)
            out = trainer.objective(logps, old, advantages, mask, inputs, **kwargs)
        dapo_aggregate(out.per_token_loss, mask, inputs).backward()
        logps.grad = None

    return call


def build_calls(args, device: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """name -> call for the baseline, every available variant and the control; labels; the unavailable ones."""
    import torch

    from trl_groupopt.offline import build_tokenizer

    oargs = overhead.parse_args(["--smoke", "--seed", str(args.seed)])  # the task-sized model: only scores the batch
    oargs.__dict__.update(vocab_size=None, completion_length=args.length, batch_size=args.batch_size,
                          num_generations=args.num_generations, grad_accum=1, steps_per_generation=2)  # fmt: skip
    tokenizer = build_tokenizer()
    dataset = overhead.make_prompts(64, oargs.prompt_length, args.seed)
    wanted = set(args.trainers.split(",")) if args.trainers else None
    calls, labels, not_available = {}, {}, {}
    drift = None
    with tempfile.TemporaryDirectory(prefix="loss-overhead-") as workdir:
        for variant in overhead.variants():
            if variant.name == CONTROL or (wanted and variant.name not in wanted | {BASELINE}):
                continue
            why = overhead.availability(variant, oargs, device, torch.float32)
            if why:
                not_available[variant.name] = why
                continue
            trainer = overhead.build_trainer(variant, oargs, device, torch.float32, tokenizer, dataset, workdir)[0]
            inputs = scored_batch(trainer, dataset, args, device)
            if drift is None:  # the same drift for every trainer: the same ratios, the same clipping
                g = torch.Generator().manual_seed(args.seed)
                drift = (0.05 * torch.randn(inputs["completion_mask"].shape, generator=g)).to(device)
            is_trl = variant.method is None
            calls[variant.name] = make_call(None if is_trl else trainer, inputs, drift)
            labels[variant.name] = "TRL's clipped surrogate (GRPOTrainer._compute_loss)" if is_trl else variant.label
            if is_trl:
                calls[CONTROL] = make_call(None, inputs, drift)
    labels[CONTROL] = "TRL's clipped surrogate again (A/A control: the noise floor)"
    return calls, labels, not_available


def timer(device: str, reps: int):
    """sample(call) -> seconds for `reps` calls: CUDA events on a drained stream, else the CPU clock."""
    import torch

    if device != "cuda":

        def sample(call) -> float:
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            return time.perf_counter() - t0

        return sample

    def sample(call) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return sample


def run_rounds(calls: dict[str, Any], args, device: str) -> tuple[dict[str, list[float]], str]:
    """Rotated rounds until the control's floor is below the target (after --min-rounds) or the budget is spent."""
    import gc

    sample = timer(device, args.reps)
    for call in calls.values():  # warm-up: allocator, kernels, autograd graph caches
        sample(call)
    order, times = list(calls), {name: [] for name in calls}
    started = time.perf_counter()
    gc.disable()
    try:
        while True:
            for name in order:
                times[name].append(sample(calls[name]))
            order = order[1:] + order[:1]
            rounds = len(times[BASELINE])
            if rounds >= args.min_rounds and rounds % 10 == 0:
                floor = overhead.noise_floor(estimate(times, CONTROL))
                if floor is not None and floor < args.noise_target:
                    return times, f"noise floor below {args.noise_target:.1%} after {rounds} rounds"
            if time.perf_counter() - started > args.max_seconds:
                return times, f"time budget of {args.max_seconds:.0f} s spent ({rounds} rounds)"
            gc.collect()
    finally:
        gc.enable()


def estimate(times: dict[str, list[float]], name: str) -> dict[str, Any]:
    logs = [math.log(a / b) for a, b in zip(times[name], times[BASELINE])]
    est = overhead.ratio_estimate(logs)
    return {"time_ratio": est["ratio"], "time_ratio_ci95": [est["low"], est["high"]], "rounds": est["n_cycles"]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.setup_environment()
    device = common.resolve_device(args.device)
    args.max_seconds = args.max_seconds or (40.0 if device == "cuda" else 150.0)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    calls, labels, not_available = build_calls(args, device)
    print(f"loss overhead on {common.describe_device(device)['description']}: {len(calls)} losses, batch "
          f"{args.batch_size} x {args.length}, {args.reps} calls per sample", flush=True)  # fmt: skip
    times, stop_reason = run_rounds(calls, args, device)
    results = {}
    for name in calls:
        entry = estimate(times, name)
        results[name] = {"label": labels[name], "us_per_call": 1e6 * common.median(times[name]) / args.reps,
                         **entry, "target_time_ratio": None}  # fmt: skip
    floor = overhead.noise_floor(results[CONTROL])
    key = f"b{args.batch_size}_t{args.length}"
    payload = {
        "benchmark": "loss_overhead",
        "device": common.describe_device(device),
        "command": common.command_line("benchmarks.loss_overhead", args.argv),
        "smoke": args.smoke,
        "machine_load": {
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg() if load_before else None,
            "niceness": os.nice(0) if hasattr(os, "nice") else None,
            "note": "CPU timings on a machine shared with other jobs unless the load average says otherwise",
        },  # fmt: skip
        "settings": {
            k: getattr(args, k)
            for k in (
                "batch_size",
                "num_generations",
                "length",
                "reps",
                "min_rounds",
                "max_seconds",
                "noise_target",
                "seed",
            )
        },  # fmt: skip
        "timed": "per call: compute_advantages + objective hook + TRL's dapo aggregation + backward to the log-probs "
        "(model in eval mode); ratio = exp(robust mean over rotated rounds of log(sample / trl_grpo's))",
        "stop_reason": stop_reason,
        "not_available": not_available,
        "shapes": {key: {"noise_floor": floor, "results": results}},
    }
    rows = [[n, f"{e['us_per_call']:.0f}", f"{e['time_ratio']:.3f}x",
             f"[{e['time_ratio_ci95'][0]:.3f}, {e['time_ratio_ci95'][1]:.3f}]", e["label"][:60]]
            for n, e in results.items()]  # fmt: skip
    table = common.print_table(["loss", "us/call", "x TRL loss", "95% CI", "what"], rows)
    print(f"noise floor (A/A): +-{floor:.2%}; {stop_reason}")
    stem = "loss_overhead_smoke" if args.smoke else f"loss_overhead_{device}"
    common.write_json(args.output_dir / f"{stem}.json", payload)
    (args.output_dir / f"{stem}.md").write_text(
        f"Loss-level overhead, batch {args.batch_size} x {args.length} tokens, {payload['device']['description']}; "
        f"A/A noise floor +-{floor:.2%}; {stop_reason}; load average {load_before} -> "
        f"{payload['machine_load']['loadavg_after']} (niceness {payload['machine_load']['niceness']}).\n\n"
        f"```\n{table}\n```\n\nCommand: `{payload['command']}`\n"
    )
    png = overhead.plot(payload, args.output_dir / f"{stem}.png")
    print(f"wrote {args.output_dir / stem}.json, .md" + (", .png" if png else ""))
    return payload


if __name__ == "__main__":
    main()
