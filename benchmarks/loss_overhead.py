"""Loss-level overhead: each method's advantages + objective + backward against TRL's clipped surrogate, one batch.

Every trainer of `overhead.variants()` scores one batch of the overhead benchmark's fixed completions (`scored_batch`);
a *call* is what `_compute_loss` does between the forward and the optimizer (`make_call`); rounds time every call in
a seeded random order until the A/A control's noise floor is below `--noise-target` (`run_rounds`), each ratio the
median over rounds (`median_ratio`). The design: benchmarks/README.md.

    python -m benchmarks.loss_overhead --device cpu      # the committed CPU table
    python -m benchmarks.loss_overhead --device cuda     # GPU, under a minute
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import common, overhead

BASELINE, CONTROL = overhead.BASELINE, overhead.CONTROL


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--smoke", action="store_true", help="A few seconds of rounds on CPU, short completions.")
    ints = (("--batch-size", 8, "sequences"), ("--num-generations", 4, "group size"), ("--seed", 0, "seed"),
            ("--length", 512, "completion tokens"), ("--reps", None, "calls per try (10; CUDA 3)"),
            ("--blocks", None, "tries per sample, the least counts (5; CUDA 3)"),
            ("--min-rounds", 60, "before the floor may stop"))  # fmt: skip
    for flag, default, text in ints:
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument("--max-seconds", type=float, default=50.0, help="Timing budget.")
    p.add_argument("--noise-target", type=float, default=0.01, help="Stop once the A/A floor is below this.")
    p.add_argument("--trainers", help="Comma-separated subset of the variant names (default: all).")
    p.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    args = p.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    if args.smoke:
        args.device, args.length, args.reps, args.blocks, args.min_rounds, args.max_seconds = "cpu", 64, 2, 2, 5, 5.0
    return args


def trl_surrogate(per_token_logps, old_per_token_logps, advantages, epsilon_low: float, epsilon_high: float):
    """(B, T) per-token loss of TRL's default objective (token-level ratio, clipped surrogate, no delta)."""
    import torch

    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): importance_sampling_level "token", the clipped surrogate
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def dapo_aggregate(per_token_loss, mask, inputs):
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): loss_type "dapo", one process, one micro-batch per generation
    return (per_token_loss * mask).sum() / inputs["num_items_in_batch"].clamp(min=1.0)


def scored_batch(trainer, dataset, args) -> dict[str, Any]:
    """The trainer's own batch fields (its scoring of one generation batch) for its first micro-batch."""
    import torch

    rows = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    trainer.model.train()  # scored as in training (num_generations, off-policy behaviour forward)
    with torch.no_grad():  # whole groups, as TRL's RepeatSampler delivers them
        full = trainer._generate_and_score_completions([dataset[i // args.num_generations] for i in range(rows)])
    trainer.model.eval()
    return {
        k: v[: args.batch_size] if torch.is_tensor(v) and v.dim() and len(v) == rows else v for k, v in full.items()
    }


def make_call(trainer, inputs: dict[str, Any], drift):
    """One loss + backward of `trainer` (None: TRL's surrogate, GRPOConfig's epsilon 0.2) as a callable."""
    old, mask = inputs["old_per_token_logps"].float(), inputs["completion_mask"]
    logps = (old + drift).detach().requires_grad_(True)
    kwargs = {"token_weights": None} if getattr(trainer, "objective_applies_token_weights", False) else {}

    def call() -> None:
        if trainer is None:
            per_token_loss = trl_surrogate(logps, old, inputs["advantages"], 0.2, 0.2)
        else:
            with trainer._metrics_discarded():  # queued metrics are flushed by _compute_loss, not called here
                advantages = trainer.compute_advantages(inputs, logps, mask)
                per_token_loss = trainer.objective(logps, old, advantages, mask, inputs, **kwargs).per_token_loss
        dapo_aggregate(per_token_loss, mask, inputs).backward()
        logps.grad = None

    return call


def build_calls(args, device: str) -> tuple[dict[str, Any], dict[str, str]]:
    """name -> call for the baseline, every variant and the control; their labels."""
    import torch

    from trl_groupopt.data.offline import build_tokenizer

    oargs = overhead.parse_args(["--smoke", "--seed", str(args.seed)])  # the task-sized model only scores the batch
    oargs.__dict__.update(vocab_size=None, completion_length=args.length, batch_size=args.batch_size,
                          num_generations=args.num_generations, grad_accum=1, steps_per_generation=2)  # fmt: skip
    tokenizer, dataset = build_tokenizer(), overhead.make_prompts(64, oargs.prompt_length, args.seed)
    drift = 0.05 * torch.randn((args.batch_size, args.length), generator=torch.Generator().manual_seed(args.seed))
    calls, labels = {}, {}
    with tempfile.TemporaryDirectory(prefix="loss-overhead-") as workdir:
        for v in overhead.variants()[:-1]:  # the control is the baseline's function, timed again
            if args.trainers and v.name not in args.trainers.split(",") + [BASELINE]:
                continue
            trainer = overhead.build_trainer(v, oargs, device, torch.float32, tokenizer, dataset, workdir)
            inputs = scored_batch(trainer, dataset, args)
            width = inputs["completion_mask"].shape[1]
            calls[v.name] = make_call(None if v.method is None else trainer, inputs, drift[:, :width].to(device))
            labels[v.name] = v.label
            if v.method is None:
                calls[CONTROL] = make_call(None, inputs, drift[:, :width].to(device))
    labels[BASELINE] = "TRL's clipped surrogate (GRPOTrainer._compute_loss)"
    labels[CONTROL] = "TRL's clipped surrogate again (A/A control: the noise floor)"
    return calls, labels


def sampler(device: str, reps: int, blocks: int):
    """sample(call) -> seconds for `reps` calls, the least of `blocks` back-to-back tries (an interruption by another
    process only lengthens a try): CUDA events on a drained stream, else this thread's CPU time
    (`overhead.step_clock`)."""
    import torch

    clock = overhead.step_clock(device)

    def block(call) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = clock()
        for _ in range(reps):
            call()
        if device != "cuda":
            return clock() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return lambda call: min(block(call) for _ in range(blocks))


def median_ratio(log_ratios: list[float]) -> dict[str, Any]:
    """exp of the median log ratio with its distribution-free 95% interval (order statistics n/2 -+ 0.98 sqrt(n)):
    a sample stretched by another process's interruption moves the median by one rank, the mean by its size."""
    x, n = sorted(log_ratios), len(log_ratios)
    k = math.floor(n / 2 - 0.98 * math.sqrt(n))
    mid = (x[(n - 1) // 2] + x[n // 2]) / 2
    low, high = (math.exp(x[k]), math.exp(x[n - 1 - k])) if k >= 0 else (None, None)
    return {"time_ratio": math.exp(mid), "time_ratio_ci95": [low, high], "rounds": n}


def estimate(times: dict[str, list[float]], name: str) -> dict[str, Any]:
    return median_ratio([math.log(a / b) for a, b in zip(times[name], times[BASELINE])])


def run_rounds(calls: dict[str, Any], args, device: str) -> tuple[dict[str, list[float]], str]:
    """Rounds in a seeded random order until the control's floor is below the target (after --min-rounds) or the
    budget is spent. Not rotated: the control is the baseline's own function and inputs, and one that always ran
    right after the other found warm caches (measured: 9% faster on a CPU)."""
    sample, times, rng = sampler(device, args.reps, args.blocks), {n: [] for n in calls}, random.Random(args.seed)
    for call in calls.values():  # warm-up: allocator, kernels
        sample(call)
    started = time.perf_counter()
    gc.disable()  # collections between rounds only
    try:
        while True:
            for name in rng.sample(list(calls), len(calls)):  # a fresh order: no loss always follows the same one
                times[name].append(sample(calls[name]))
            rounds = len(times[BASELINE])
            floor = overhead.noise_floor(estimate(times, CONTROL)) if rounds >= args.min_rounds else None
            if floor is not None and floor < args.noise_target:
                return times, f"noise floor below {args.noise_target:.1%} after {rounds} rounds"
            if time.perf_counter() - started > args.max_seconds:
                return times, f"time budget of {args.max_seconds:.0f} s spent ({rounds} rounds)"
            if rounds % 50 == 0:  # rarely: a collection over every trainer's objects takes ~0.3 s
                gc.collect()
    finally:
        gc.enable()


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.setup_environment()
    device = common.resolve_device(args.device)
    # CUDA: a DFPO call is ~10 ms there (host syncs), so shorter samples keep a round under half a second
    args.reps = args.reps or (3 if device == "cuda" else 10)
    args.blocks = args.blocks or (3 if device == "cuda" else 5)
    __import__("torch").set_num_threads(1)  # as on CPU: the launching thread alone
    load = {"loadavg_before": os.getloadavg(), "niceness": os.nice(0)}
    calls, labels = build_calls(args, device)
    print(f"loss overhead, {common.describe_device(device)['description']}: {len(calls)} losses, batch "
          f"{args.batch_size} x {args.length}, samples of {args.blocks} x {args.reps} calls", flush=True)  # fmt: skip
    times, stop_reason = run_rounds(calls, args, device)
    load.update(loadavg_after=os.getloadavg(), note="CPU timings are from a machine shared with other jobs when the "
                "load average exceeds the cores in use (one torch thread here)")  # fmt: skip
    results = {n: {"label": labels[n], "us_per_call": 1e6 * statistics.median(t) / args.reps, **estimate(times, n),
                   "target_time_ratio": None, "sample_s": t} for n, t in times.items()}  # fmt: skip
    floor = overhead.noise_floor(results[CONTROL])
    names = ("batch_size", "num_generations", "length", "reps", "blocks", "min_rounds", "max_seconds", "noise_target")
    settings = {k: getattr(args, k) for k in names + ("seed",)}
    payload = {"benchmark": "loss_overhead", "device": common.describe_device(device), "smoke": args.smoke,
               "command": common.command_line("benchmarks.loss_overhead", args.argv), "machine_load": load,
               "settings": settings, "stop_reason": stop_reason,
               "timed": "per call: compute_advantages + objective hook + TRL's dapo aggregation + backward to the "
               "log-probs (model in eval mode); ratio = exp(median over rounds of log(sample / trl_grpo's))",
               "clock": "CUDA events" if device == "cuda" else "this thread's CPU time (time.thread_time)",
               "shapes": {f"b{args.batch_size}_t{args.length}": {"noise_floor": floor, "results": results}},
               }  # fmt: skip
    table = common.print_table(["loss", "us/call", "x TRL loss", "95% CI", "what"], [
        [n, f"{e['us_per_call']:.0f}", f"{e['time_ratio']:.3f}x", "[{:.3f}, {:.3f}]".format(*e["time_ratio_ci95"]),
         e["label"][:70]] for n, e in results.items()])  # fmt: skip
    print(f"noise floor (A/A): +-{floor:.2%}; {stop_reason}")
    stem = args.output_dir / ("loss_overhead_smoke" if args.smoke else f"loss_overhead_{device}")
    common.write_json(stem.with_suffix(".json"), payload)
    stem.with_suffix(".md").write_text(
        f"Loss-level overhead ({payload['device']['description']}): batch "
        f"{args.batch_size} x {args.length} tokens, groups of {args.num_generations}; a sample is the least of "
        f"{args.blocks} tries of {args.reps} calls ({payload['clock']}); "
        f"A/A noise floor +-{floor:.2%}; {stop_reason}. Load average {load['loadavg_before']} before, "
        f"{load['loadavg_after']} after, niceness {load['niceness']}: {load['note']}.\n\n```\n{table}\n```\n\n"
        f"Command: `{payload['command']}`\n"
    )  # fmt: skip
    print(f"wrote {stem}.json, .md and {overhead.plot(payload, stem.with_suffix('.png'))}")
    return payload


if __name__ == "__main__":
    main()
