"""Optimizer-step time (on CUDA also activation memory) of every trl-groupopt trainer against TRL's GRPOTrainer.

Generation is replaced by fixed random completions (`make_fake_sampler`); each run steps its trainers in lockstep
(`Lockstep`) with TRL's GRPOTrainer (`trl_grpo`, the baseline) and the A/A control (`trl_grpo_again`), and each ratio
is a trimmed mean over paired generation cycles (`ratio_estimate`). The design, settings, defaults and measured noise:
benchmarks/README.md and docs/gpu.md.

    python -m benchmarks.overhead --smoke --output-dir outputs/bench     # CPU, about 1 min
    python -m benchmarks.overhead --device cpu                            # the CPU table: 12-20 min, shared ok
    python -m benchmarks.overhead --device cuda                           # GPU, about 4.5 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from . import common
from .overhead_lockstep import (
    Lockstep,
    lockstep_groups,
    run_trainers,
    step_clock,
    step_timer,
    train_in_lockstep,
)
from .overhead_stats import (
    TIMED,
    TRIM,
    build_payload,
    cycle_log_ratios,
    noise_floor,
    plot,
    ratio_estimate,
    resummarise,
    summarise,
)
from .overhead_workload import (
    BASELINE,
    CONTROL,
    EXTRA_VARIANTS,
    METHOD_TARGETS,
    QWEN25_05B,
    REPORTED_ONLY_DEFAULTS,
    TINY,
    Variant,
    build_model,
    build_trainer,
    classes,
    config_kwargs_for,
    make_fake_sampler,
    make_prompts,
    synthetic_reward,
    target_of,
    variants,
)

#: The public names: the CLI's here, the rest from the modules they live in (`overhead_workload`, `overhead_lockstep`,
#: `overhead_stats`), kept importable from `benchmarks.overhead` for its callers.
__all__ = [
    "ALLOCATOR_TUNABLES", "BASELINE", "CONTROL", "CPU_DEFAULTS", "EXTRA_VARIANTS", "GPU_DEFAULTS", "METHOD_TARGETS",
    "QWEN25_05B", "REPORTED_ONLY_DEFAULTS", "SMOKE_DEFAULTS", "TIMED", "TINY", "TRIM", "Lockstep", "Variant",
    "build_model", "build_payload", "build_trainer", "classes", "config_kwargs_for", "cycle_log_ratios", "fit_steps",
    "lockstep_groups", "main", "make_fake_sampler", "make_prompts", "noise_floor", "parse_args", "parse_shapes", "plot",
    "ratio_estimate", "reexec_with_allocator_settings", "resummarise", "run_all", "run_trainers", "step_clock",
    "step_timer", "summarise", "synthetic_reward", "target_of", "train_in_lockstep", "variants",
]  # fmt: skip

# shapes: "VOCABxCOMPLETION" (vocab 0 = the task tokenizer's own ~70 tokens); groups of 4, off-policy schedules
_TINY_RUN = dict(batch_size=4, num_generations=4, grad_accum=1, steps_per_generation=2, model="tiny")
CPU_DEFAULTS = dict(_TINY_RUN, steps=32, warmup=2, min_repeats=1, max_repeats=40, max_minutes=60.0, group_size=3,
                    shapes="32000x128,151936x64", prompt_length=32)  # fmt: skip
GPU_DEFAULTS = dict(steps=16, warmup=2, min_repeats=1, max_repeats=4, max_minutes=5.2, group_size=3,
                    shapes="151936x512", prompt_length=128, batch_size=32, num_generations=4, grad_accum=2,
                    steps_per_generation=4, model="qwen2.5-0.5b")  # fmt: skip
SMOKE_DEFAULTS = dict(_TINY_RUN, steps=4, warmup=2, min_repeats=1, max_repeats=1, max_minutes=5.0, group_size=4,
                      shapes="0x24", prompt_length=16)  # fmt: skip


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """ "32000x128,151936x64" -> [(32000, 128), (151936, 64)]."""
    return [(int(v), int(t)) for v, _, t in (part.strip().lower().partition("x") for part in text.split(","))]


def parse_args(argv=None) -> argparse.Namespace:
    """The flags; the workload's shape (model, batch, schedule) comes from the device's `*_DEFAULTS`."""
    p = argparse.ArgumentParser(description="Optimizer-step time of TRL's GRPOTrainer vs every trl-groupopt trainer.")
    p.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR, help="Where JSON and PNG go.")
    p.add_argument("--smoke", action="store_true", help="Task-sized model and vocabulary on CPU (about 1 min).")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--trainers", help="Comma-separated subset of the variant names (default: all).")
    p.add_argument("--shapes", help="Comma-separated VOCABxCOMPLETION_LENGTH (default: per device).")
    for flag in ("--steps", "--warmup", "--min-repeats", "--max-repeats", "--repeats", "--group-size"):
        p.add_argument(flag, type=int, help="timed / untimed steps per run, repeats, trainers per run (0: all)")
    p.add_argument("--noise-target", type=float, default=0.02, help="Stop once the A/A interval is within 1 +- this.")
    p.add_argument("--max-minutes", type=float, help="No run starts that would end past this budget.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-json", type=Path, help="Recompute an earlier run's JSON in place from its step times.")
    args = p.parse_args(argv)
    args.argv = None if argv is None else list(argv)  # recorded as the command when main() is called in-process
    if args.device == "auto" and not args.smoke:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.device = "cpu" if args.smoke else args.device
    if args.repeats is not None:
        args.min_repeats = args.max_repeats = args.repeats
    defaults = SMOKE_DEFAULTS if args.smoke else GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS
    for key, value in dict(defaults, gradient_checkpointing=False).items():
        setattr(args, key, value if getattr(args, key, None) is None else getattr(args, key))
    args.shape_list = parse_shapes(args.shapes)
    args.cycle_steps = cycle = max(1, args.steps_per_generation // args.grad_accum)  # one scoring call per cycle
    args.warmup, args.steps = (-(-max(n, 1) // cycle) * cycle for n in (args.warmup, args.steps))
    args.output_stem = "overhead_smoke" if args.smoke else f"overhead_{args.device}"
    return args


def fit_steps(args, state: dict, key: str, runs_left: list[list[Variant]]) -> int | None:
    """Timed steps for the next run of shape `key`: --steps, or fewer when this repeat's runs left would end past
    --max-minutes at the last run's time per step and per trainer set-up; None when one cycle each does not fit."""
    if key not in state["cost"]:
        return args.steps
    per_trainer, per_step = state["cost"][key]
    left = 60 * args.max_minutes - (time.perf_counter() - state["started"])
    steps = int((left / sum(map(len, runs_left)) - per_trainer) / per_step) - args.warmup
    steps = min(args.steps, steps // args.cycle_steps * args.cycle_steps)
    return steps if steps >= args.cycle_steps else None


def run_all(args, device: str, dtype, tokenizer, dataset, state: dict, workdir: str) -> None:
    """Repeats of every unresolved shape's runs until its floor is below the target (after --min-repeats),
    --max-repeats, or the budget is spent (`fit_steps`); the JSON is rewritten after every run."""
    keys, resolved = list(state["records"]), set()
    for repeat in range(args.max_repeats):
        order = state["runnable"] if repeat % 2 == 0 else state["runnable"][::-1]
        for (vocab, length), key in zip(args.shape_list, keys):
            groups = lockstep_groups(order, args.group_size) if key not in resolved else []
            for i, group in enumerate(groups):
                if (steps := fit_steps(args, state, key, groups[i:])) is None:
                    state["stop_reason"] = f"time budget: the next run would end past --max-minutes {args.max_minutes}"
                    return
                t0 = time.perf_counter()
                sargs = argparse.Namespace(**{**vars(args), "vocab_size": vocab or None, "completion_length": length,
                                              "steps": steps})  # fmt: skip
                by_name = run_trainers(group, sargs, device, dtype, tokenizer, dataset, workdir)
                run = len(state["run_seconds"][key])  # this run's index among the shape's runs
                for name, record in by_name.items():
                    state["records"][key][name].append(
                        dict(record, baseline_step_s=by_name[BASELINE]["step_s"], run=run)
                    )
                seconds = time.perf_counter() - t0
                per_step = statistics.median(s for r in by_name.values() for s in r["step_s"])
                state["cost"][key] = (max(0.0, seconds / len(group) - (args.warmup + steps) * per_step), per_step)
                state["run_seconds"][key].append(seconds)
                state["run_steps"][key].append(steps)
                state["repeats"][key] = repeat + 1
                path = args.output_dir / f"{args.output_stem}.json"
                common.write_json(path, build_payload(args, device, dtype, state))  # a cut-short run keeps numbers
                last = {n: state["records"][key][n][-1] for n in by_name}
                ratios = {n: ratio_estimate(cycle_log_ratios([r], args.cycle_steps))["ratio"] for n, r in last.items()}
                print(f"  [{repeat + 1}] {key} {seconds:.0f} s, {steps} timed steps; ratio this run: "
                      + ", ".join(f"{n} {r:.3f}" for n, r in ratios.items()), flush=True)  # fmt: skip
        floors = {k: s["noise_floor"] for k, s in build_payload(args, device, dtype, state)["shapes"].items()}
        print(f"  repeat {repeat + 1}: noise floors {floors}", flush=True)
        if repeat + 1 >= args.min_repeats:
            resolved |= {k for k, f in floors.items() if f is not None and f < args.noise_target}
        if resolved >= set(keys):
            state["stop_reason"] = f"noise floor below {args.noise_target:.0%} for every shape"
            return
    state["stop_reason"] = f"--max-repeats {args.max_repeats} reached"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        payload = resummarise(json.loads(args.from_json.read_text()), common.command_line("benchmarks.overhead", argv))
        print(payload["table"])
        print(
            f"wrote {common.write_json(args.from_json, payload)} and {plot(payload, args.from_json.with_suffix('.png'))}"
        )
        return payload
    common.setup_environment()
    if args.device == "cuda":  # read at the first CUDA allocation
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    device = common.resolve_device(args.device)
    import torch
    import transformers

    torch.set_num_threads(1)  # on CUDA too: no OpenMP pool spinning beside the launching thread (CPU-bound steps)

    from trl_groupopt.data.offline import build_tokenizer

    transformers.logging.set_verbosity_error()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    chosen = variants()
    if args.trainers:
        wanted = {t.strip() for t in args.trainers.split(",") if t.strip()} | {BASELINE, CONTROL}
        if unknown := wanted - {v.name for v in chosen}:
            raise SystemExit(f"unknown trainer(s) {sorted(unknown)}; choose from {[v.name for v in chosen]}")
        chosen = [v for v in chosen if v.name in wanted]
    keys = [f"v{vocab or 'task'}_t{length}" for vocab, length in args.shape_list]
    state = {"runnable": chosen, "started": time.perf_counter(),
             "records": {k: {v.name: [] for v in chosen} for k in keys}, "run_seconds": {k: [] for k in keys},
             "repeats": {k: 0 for k in keys}, "run_steps": {k: [] for k in keys}, "cost": {},
             "stop_reason": None}  # fmt: skip
    runs = [[v.name for v in g] for g in lockstep_groups(chosen, args.group_size)]
    print(f"{common.describe_device(device)['description']}; shapes {keys}; runs {runs}; {args.warmup} + "
          f"{args.steps} steps per run", flush=True)  # fmt: skip
    cycles = -(-(args.warmup + args.steps) // args.cycle_steps)
    num_prompts = args.batch_size * args.steps_per_generation // args.num_generations * cycles + 64
    with tempfile.TemporaryDirectory(prefix="overhead-") as workdir:
        dataset = make_prompts(num_prompts, args.prompt_length, args.seed)
        run_all(args, device, dtype, build_tokenizer(), dataset, state, workdir)
    from .report import overhead_markdown

    payload = build_payload(args, device, dtype, state)
    payload["table"] = overhead_markdown(payload)  # the ratio of each run: printed above, and in the JSON
    print(payload["table"])
    print(f"stopped: {state['stop_reason']}")
    json_path = common.write_json(args.output_dir / f"{args.output_stem}.json", payload)
    print(f"wrote {json_path} and {plot(payload, args.output_dir / f'{args.output_stem}.png')}")
    return payload


#: glibc malloc settings (Linux): one arena (a thread arena serves no chunk above 64 MiB, so every logits buffer of
#: a trainer's thread was mmap'd and page-faulted anew: scoring measured 2.5-4.7x slower in a thread), large buffers
#: kept, huge pages. Fixed at process start, hence `reexec_with_allocator_settings`.
ALLOCATOR_TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4294967296:"
                      "glibc.malloc.trim_threshold=4294967296")  # fmt: skip


def reexec_with_allocator_settings() -> None:
    """Re-run this command with `ALLOCATOR_TUNABLES` unless GLIBC_TUNABLES sets them (Linux, glibc only)."""
    import platform
    import sys

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    if glibc and "arena_max" not in os.environ.get("GLIBC_TUNABLES", ""):
        print(f"re-running with GLIBC_TUNABLES={ALLOCATOR_TUNABLES} (benchmarks.overhead.ALLOCATOR_TUNABLES)")
        env = {**os.environ, "GLIBC_TUNABLES": ALLOCATOR_TUNABLES}
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.overhead", *sys.argv[1:]], env)


if __name__ == "__main__":
    reexec_with_allocator_settings()
    main()
