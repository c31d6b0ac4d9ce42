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
import gc
import json
import math
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import common

BASELINE = "trl_grpo"
CONTROL = "trl_grpo_again"  # a second TRL GRPOTrainer in every run: its ratio to the first is the noise floor
#: Time-ratio targets against TRL's GRPOTrainer, by registry method (issue 18). Variants inherit their method's.
METHOD_TARGETS = {"grpo": 1.01, "echo": 1.03, "dfpo": 1.03, "grpo_fix": 1.03, "ctpo": 1.03, "otb": 1.05}
#: Defaults reported, not targeted: ECHO's batch_ratio_scope="step" costs one extra no-grad forward per micro-batch
#: by design on each optimizer step of a rollout but the first, where a step has several micro-batches (none with
#: one: docs/echo.md); the ECHO target applies to its "micro_batch" scope (EXTRA_VARIANTS).
REPORTED_ONLY_DEFAULTS = {
    "echo": "batch_ratio_scope='step' (default): an extra no-grad forward after a rollout's first step, at 2+ "
    "micro-batches a step"
}


@dataclass(frozen=True)
class Variant:
    """One trainer configuration to time: a registry method (None = TRL's GRPOTrainer) plus config overrides."""

    name: str
    method: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""


#: Configurations beside each method's defaults.
EXTRA_VARIANTS: tuple[Variant, ...] = (
    Variant("echo_micro_batch", "echo", {"batch_ratio_scope": "micro_batch"}, "ECHO, batch ratio per micro-batch"),
    Variant("dfpo_orth_proj", "dfpo", {"dfpo_transform": "orth_proj"}, "DFPO orth_proj"),
    Variant("dfpo_orth_proj_unclipped", "dfpo", {"dfpo_transform": "orth_proj", "dfpo_orthogonal_over": "unclipped"},
            "DFPO orth_proj over unclipped tokens"),
    Variant("dfpo_orth_proj_qp", "dfpo", {"dfpo_transform": "orth_proj_qp"}, "DFPO orth_proj_qp (exact QP)"),
    Variant("ctpo_geomean", "ctpo", {"ctpo_ratio_mode": "geomean"}, "CTPO, geometric-mean prefix ratio"),
    Variant("ctpo+otb", "ctpo", {"advantage_estimator": "otb"}, "CTPO on OTB's advantages"),
    Variant("echo+otb", "echo", {"advantage_estimator": "otb", "batch_ratio_scope": "micro_batch"},
            "ECHO (batch ratio per micro-batch) on OTB's advantages"),
)  # fmt: skip


def variants() -> list[Variant]:
    """The baseline, every registered method's defaults, their `EXTRA_VARIANTS`, the control."""
    from trl_groupopt import METHODS

    out = [Variant(BASELINE, None, {}, "TRL GRPOTrainer")]
    for key, spec in METHODS.items():
        label = "GroupOptTrainer (TRL's objective)" if key == "grpo" else spec.trainer_class.__name__
        why = REPORTED_ONLY_DEFAULTS.get(key)
        out.append(Variant("base" if key == "grpo" else key, key, {}, f"{label} ({why})" if why else label))
    out += [v for v in EXTRA_VARIANTS if v.method in METHODS]
    return out + [Variant(CONTROL, None, {}, "TRL GRPOTrainer again (A/A control: the noise floor)")]


def target_of(variant: Variant) -> float | None:
    """Its method's target, OTB's on OTB's advantages (the energy capture is OTB's cost); None for TRL's trainer and
    the defaults reported only."""
    if variant.name in REPORTED_ONLY_DEFAULTS:
        return None
    return METHOD_TARGETS.get("otb" if variant.overrides.get("advantage_estimator") == "otb" else variant.method)


QWEN25_05B = dict(  # Qwen/Qwen2.5-0.5B config.json shapes
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip
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


# ------------------------------------------------------------------------------------------------ the workload
def synthetic_reward(completions, completion_ids, **kwargs) -> list[float]:
    """Deterministic pseudo-random reward in [0, 1) from the token ids: cheap, with spread inside groups."""
    rewards = []
    for ids in completion_ids:
        h = 0
        for i, tok in enumerate(ids):
            h = (h * 31 + (i + 1) * int(tok)) % 1_000_003
        rewards.append((h % 997) / 997.0)
    return rewards


def make_prompts(num: int, prompt_length: int, seed: int):
    """The arithmetic task's prompts, padded with filler to about `prompt_length` (character-level) tokens."""
    from trl_groupopt.data.offline import make_arithmetic_dataset

    filler = "think about each step and check the sum before you answer. "

    def pad(row):
        content = row["prompt"][-1]["content"]
        extra = max(0, prompt_length - len(content) - 4)  # bos, role marker, newline, assistant marker
        return {"prompt": [{"role": "user", "content": (filler * (extra // len(filler) + 1))[:extra] + content}]}

    return make_arithmetic_dataset(num, seed=seed, split="train").map(pad)


def make_fake_sampler(tokenizer, completion_length: int, seed: int):
    """Stands in for `GRPOTrainer._generate_single_turn`: the n-th call returns the n-th fixed batch of random
    completions (seeded by n alone): lengths uniform in [L // 4, L], a quarter cut at L without EOS."""
    import torch

    specials = set(tokenizer.all_special_ids)
    vocab = torch.tensor([i for i in range(len(tokenizer)) if i not in specials])
    calls = {"n": 0}

    def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        g = torch.Generator().manual_seed(seed * 1_000_003 + calls["n"])
        calls["n"] += 1
        lengths = torch.randint(max(1, completion_length // 4), completion_length + 1, (len(prompt_ids),), generator=g)
        truncated = torch.rand(len(prompt_ids), generator=g) < 0.25
        lengths[truncated] = completion_length
        completions = [vocab[torch.randint(0, len(vocab), (int(n),), generator=g)].tolist() for n in lengths]
        for ids, cut in zip(completions, truncated):
            ids[-1] = ids[-1] if cut else tokenizer.eos_token_id
        return completions, None

    return generate_single_turn


_TEMPLATES: dict[tuple, Any] = {}


def build_model(args, tokenizer, device: str, dtype):
    """A copy of the benchmark model on `device`: the same random weights for every trainer (built once on the CPU
    from a seeded config, then deep-copied)."""
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    key = (args.model, args.vocab_size, str(dtype), args.seed, str(device))
    if key not in _TEMPLATES:
        shapes = dict(QWEN25_05B if args.model == "qwen2.5-0.5b" else TINY)
        shapes["vocab_size"] = max(args.vocab_size or shapes.get("vocab_size", 0), len(tokenizer))
        ids = {f"{k}_token_id": getattr(tokenizer, f"{k}_token_id") for k in ("bos", "eos", "pad")}
        torch.manual_seed(args.seed)
        _TEMPLATES[key] = template = Qwen2ForCausalLM(Qwen2Config(**shapes, **ids)).to(dtype).to(device)
        template.generation_config.update(pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"])
    return copy.deepcopy(_TEMPLATES[key])  # on the device: a copy there takes milliseconds, not a host transfer


def classes(variant: Variant):
    """(config factory, trainer class) of a variant: TRL's own for the baseline, else the registry's."""
    return common.trainer_classes(variant.method)


def config_kwargs_for(variant: Variant, args, device: str, dtype, workdir: str) -> dict[str, Any]:
    """The shared settings (the same for every trainer), then the variant's overrides."""
    import torch

    from trl_groupopt.cli.main import DEMO_DEFAULTS

    total = args.warmup + args.steps
    demo = ("lr_scheduler_type", "beta", "temperature", "save_strategy", "report_to", "disable_tqdm")
    kwargs = dict(
        {k: DEMO_DEFAULTS[k] for k in demo},  # constant schedule, no KL, sampling temperature, quiet trainer
        output_dir=os.path.join(workdir, variant.name), learning_rate=1e-6, seed=args.seed, dataloader_num_workers=0,
        per_device_train_batch_size=args.batch_size, num_generations=args.num_generations,
        gradient_accumulation_steps=args.grad_accum, steps_per_generation=args.steps_per_generation,
        max_completion_length=args.completion_length, max_steps=total, logging_steps=total + 1,
        use_cpu=device == "cpu", bf16=dtype == torch.bfloat16, gradient_checkpointing=args.gradient_checkpointing,
    )  # fmt: skip
    return {**kwargs, **variant.overrides}


# ------------------------------------------------------------------------------------------------ lockstep runs
class Lockstep:
    """Turns for the trainers' threads: one at a time, one optimizer step per turn, in `order`, rotated by one after
    every round (not reversed: that lets the end trainers run two steps in a row, the second with warm caches,
    measured as a 3-5% bias between identical trainers); a ready flag per trainer, the device, the warm-up steps."""

    def __init__(self, names: list[str], on_round=None, device: str = "cpu", warmup: int = 0):
        self.order, self.pos, self.started, self.on_round = list(names), 0, False, on_round
        self.ready = {name: threading.Event() for name in names}
        self.device, self.warmup = device, warmup
        self.cond = threading.Condition()

    def start(self) -> None:
        with self.cond:
            self.started = True
            self.cond.notify_all()

    def acquire(self, name: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.started and self.order[self.pos] == name)

    def release(self, name: str) -> None:
        with self.cond:
            self.pos += 1
            self._wrap()

    def leave(self, name: str) -> None:
        """`name` takes no more turns (its training ended, or failed): the others go on without it."""
        with self.cond:
            if name in self.order:
                self.pos -= self.order.index(name) < self.pos
                self.order.remove(name)
                self._wrap()

    def _wrap(self) -> None:
        if self.order and self.pos >= len(self.order):
            self.pos, self.order = 0, self.order[1:] + self.order[:1]
            if self.on_round is not None:
                self.on_round()  # between rounds: no trainer is inside a step
        self.cond.notify_all()


def build_trainer(variant: Variant, args, device: str, dtype, tokenizer, dataset, workdir: str):
    """A trainer on a fresh model copy with the fake sampler."""
    from transformers import PrinterCallback

    make_config, trainer_cls = classes(variant)
    trainer = trainer_cls(model=build_model(args, tokenizer, device, dtype), reward_funcs=synthetic_reward,
                          args=make_config(**config_kwargs_for(variant, args, device, dtype, workdir)),
                          train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    trainer._generate_single_turn = make_fake_sampler(tokenizer, args.completion_length, args.seed)
    trainer.remove_callback(PrinterCallback)
    return trainer


def run_trainers(variants: list[Variant], args, device: str, dtype, tokenizer, dataset, workdir: str) -> dict:
    """Train the variants for warmup + steps optimizer steps in lockstep; per trainer `step_s` per timed step and,
    on CUDA, the activation peak."""
    import torch

    built = {v.name: build_trainer(v, args, device, dtype, tokenizer, dataset, workdir) for v in variants}
    records = {name: {"step_s": [], "activation_peak_bytes": None} for name in built}
    turns = Lockstep(list(built), lambda: gc.collect(1), device, args.warmup)  # young objects: fast
    for name, trainer in built.items():
        trainer.add_callback(step_timer(turns, name, records[name]))
    train_in_lockstep(built, turns)
    for name, trainer in built.items():
        buffered = trainer._buffered_inputs[0] if trainer._buffered_inputs else {}
        records[name].update(off_policy=buffered.get("old_per_token_logps") is not None,
                             otb_energy_from_behaviour_forward="old_per_token_energy" in buffered,
                             num_parameters=sum(p.numel() for p in trainer.model.parameters()))  # fmt: skip
    del built, trainer  # the trainers and their callbacks form cycles: gc.collect() frees them
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return records


def step_timer(turns: Lockstep, name: str, record: dict):
    """The callback that times each optimizer step of `name` into `record` and takes one lockstep turn per step."""
    import torch
    from transformers import TrainerCallback

    cuda = turns.device == "cuda"
    clock = step_clock(turns.device)

    class StepTimer(TrainerCallback):
        def on_train_begin(self, _args, state, control, **kwargs):
            turns.ready[name].set()
            turns.acquire(name)  # from here on this thread runs only in its turns

        def on_step_begin(self, _args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                self.start_bytes = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            self.t0 = clock()

        def on_step_end(self, _args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            elapsed = clock() - self.t0
            if state.global_step > turns.warmup:
                record["step_s"].append(elapsed)
                if cuda:
                    peak = torch.cuda.max_memory_allocated() - self.start_bytes
                    record["activation_peak_bytes"] = max(record["activation_peak_bytes"] or 0, peak)
            if state.global_step < state.max_steps:  # the last turn ends when train() returns (train_in_lockstep)
                turns.release(name)
                turns.acquire(name)

    return StepTimer()


def step_clock(device: str):
    """Wall time on CUDA (a host sync's stall is the cost), this thread's CPU time on a CPU: with one torch thread
    the step runs in the trainer's thread, and CPU time leaves out what other processes of a shared machine take."""
    return time.perf_counter if device == "cuda" else time.thread_time


def train_in_lockstep(trainers: dict[str, Any], turns: Lockstep) -> None:
    """Train every trainer in its own thread, one step per turn, garbage collection between rounds only; re-raises
    the first failure here."""
    errors: dict[str, BaseException] = {}

    def train(name: str, trainer) -> None:
        try:
            trainer.train()
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread below
            errors[name] = error
            turns.ready[name].set()
        finally:
            turns.leave(name)

    gc.collect()
    gc.disable()
    try:
        threads = []
        for name, trainer in trainers.items():
            threads.append(threading.Thread(target=train, args=(name, trainer), name=f"overhead-{name}", daemon=True))
            threads[-1].start()
            turns.ready[name].wait()  # set-ups one at a time
        turns.start()
        for thread in threads:
            thread.join()
    finally:
        gc.enable()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"trainer {name!r} failed in the overhead benchmark") from error


def lockstep_groups(order: list[Variant], group_size: int) -> list[list[Variant]]:
    """The runs of one repeat, each with the baseline and the control, in `order`: the others grouped by method (a
    variant always runs with its method's default), methods packed first-fit by decreasing size into runs of
    `group_size` (a larger method gets a run of its own; 0: everything in one run)."""
    families: dict[str, list[Variant]] = {}
    for v in order:
        if v.name not in (BASELINE, CONTROL):
            families.setdefault(v.method or v.name, []).append(v)
    runs: list[list[Variant]] = []
    for family in sorted(families.values(), key=len, reverse=True):
        run = next((r for r in runs if not group_size or len(r) + len(family) <= group_size), None)
        if run is None:
            runs.append(run := [])
        run += family
    return [[v for v in order if v.name in (BASELINE, CONTROL) or v in run] for run in runs or [[]]]


# ------------------------------------------------------------------------------------------------ statistics
def cycle_log_ratios(runs: list[dict], cycle: int) -> list[float]:
    """log(a trainer's generation-cycle time / the baseline's same cycle in the same run), over every timed cycle
    of every run (`run["baseline_step_s"]`). A cycle holds one scoring call, so its time is the whole cost."""
    out = []
    for run in runs:
        a, b = run["step_s"], run["baseline_step_s"]
        for k in range(0, min(len(a), len(b)) - cycle + 1, cycle):
            out.append(math.log(sum(a[k : k + cycle]) / sum(b[k : k + cycle])))
    return out


TRIM = 0.2  # fraction of cycles dropped at each end
TIMED = ("Trainer.train() optimizer steps, generation replaced by fixed completions, a run's trainers in lockstep; "
         "time_ratio = exp(20%-trimmed mean over paired generation cycles of log(cycle time / TRL GRPOTrainer's same "
         "cycle in the same run)), Yuen's 95% interval; time_ms = mean step time, scoring included")  # fmt: skip


def ratio_estimate(log_ratios: list[float]) -> dict[str, Any]:
    """exp of the 20%-trimmed mean log ratio with Yuen's 95% interval (winsorized variance, n - 2g - 1 degrees of
    freedom): one step that the OS made twice as long moves a plain mean by log(2) / n (benchmarks/README.md)."""
    xs, n = sorted(log_ratios), len(log_ratios)
    g = int(TRIM * n)
    kept = xs[g : n - g]
    out = {"n_cycles": n, "ratio": math.exp(sum(kept) / len(kept)) if kept else None, "low": None, "high": None}
    if len(kept) >= 2:
        wins = [xs[g]] * g + kept + [xs[n - g - 1]] * g  # winsorized: the trimmed ends set to the nearest kept value
        centre = sum(wins) / n
        se = math.sqrt(sum((x - centre) ** 2 for x in wins) / (n - 1)) / ((1 - 2 * TRIM) * math.sqrt(n))
        half = common.t_quantile_975(len(kept) - 1) * se
        out["low"], out["high"] = out["ratio"] * math.exp(-half), out["ratio"] * math.exp(half)
    return out


def noise_floor(control: dict[str, Any]) -> float | None:
    """The larger distance from 1 of the bounds of the A/A control's 95% interval; None without one."""
    low, high = control["time_ratio_ci95"]
    return None if low is None else max(high - 1.0, 1.0 - low)


def summarise(records: dict[str, list[dict]], targets: dict, labels: dict, cycle: int) -> dict[str, dict]:
    """Pool the runs of each trainer (one shape): paired ratios to TRL's GRPOTrainer, overall and per run."""
    out: dict[str, dict] = {}
    for name, runs in records.items():
        steps = [s for r in runs for s in r["step_s"]]
        est, target = ratio_estimate(cycle_log_ratios(runs, cycle)), targets.get(name)
        peaks = [r["activation_peak_bytes"] for r in runs if r.get("activation_peak_bytes") is not None]
        out[name] = {
            "label": labels[name], "time_ms": 1e3 * sum(steps) / len(steps), "timed_steps": len(steps),
            "time_ratio": est["ratio"], "time_ratio_ci95": [est["low"], est["high"]], "paired_cycles": est["n_cycles"],
            "time_ratio_per_run": [ratio_estimate(cycle_log_ratios([r], cycle))["ratio"] for r in runs],
            "step_s_per_run": [r["step_s"] for r in runs],  # the raw timings: for a look at the noise, `resummarise`
            "run_index": [r.get("run") for r in runs],
            "activation_peak_bytes": max(peaks) if peaks else None, "num_parameters": runs[0]["num_parameters"],
            "off_policy": runs[0]["off_policy"],
            "otb_energy_from_behaviour_forward": runs[0]["otb_energy_from_behaviour_forward"],
            "target_time_ratio": target, "meets_time_target": None if target is None else est["ratio"] <= target,
            "target_cleared_at_95": None if target is None or est["high"] is None else est["high"] <= target,
        }  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------ driver
def build_payload(args, device: str, dtype, state: dict) -> dict:
    """overhead_<device>.json: the settings, and per shape every trainer's paired ratio to TRL's GRPOTrainer."""
    targets, labels = {v.name: target_of(v) for v in state["runnable"]}, {v.name: v.label for v in state["runnable"]}
    shapes = {}
    for (vocab, length), (key, by_trainer) in zip(args.shape_list, state["records"].items()):
        if by_trainer[BASELINE]:
            results = summarise({n: r for n, r in by_trainer.items() if r}, targets, labels, args.cycle_steps)
            shapes[key] = {"vocab_size": vocab or None, "completion_length": length, "repeats": state["repeats"][key],
                           "noise_floor": noise_floor(results[CONTROL]) if CONTROL in results else None,
                           "run_seconds": state["run_seconds"][key], "run_steps": state["run_steps"][key],
                           "results": results}  # fmt: skip
    names = ("model", "shapes", "prompt_length", "num_generations", "steps_per_generation", "gradient_checkpointing",
             "cycle_steps", "group_size", "min_repeats", "max_repeats", "noise_target", "max_minutes",
             "seed")  # fmt: skip
    settings = {k: getattr(args, k) for k in names} | {
        "dtype": str(dtype).replace("torch.", ""), "per_device_train_batch_size": args.batch_size,
        "gradient_accumulation_steps": args.grad_accum, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "runs": [[v.name for v in g] for g in lockstep_groups(state["runnable"], args.group_size)],
        "timed": TIMED,
        "clock": "wall time, synchronized" if device == "cuda" else "the trainer thread's CPU time (time.thread_time)",
        "noise_floor": f"max distance from 1 of the 95% interval of {CONTROL} / {BASELINE}"}  # fmt: skip
    env = ("GLIBC_TUNABLES", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF")
    return {"benchmark": "overhead", "device": common.describe_device(device), "smoke": args.smoke,
            "command": common.command_line("benchmarks.overhead", args.argv),
            "environment": {k: os.environ[k] for k in env if k in os.environ}, "settings": settings,
            "baseline": BASELINE, "control": CONTROL,
            "variants": {v.name: {"method": v.method, "overrides": v.overrides} for v in state["runnable"]},
            "repeats_done": max(state["repeats"].values()), "stop_reason": state["stop_reason"],
            "wall_s": time.perf_counter() - state["started"], "shapes": shapes,
            "memory_kind": "cuda activation peak per timed step" if device == "cuda" else "not measured on CPU",
            }  # fmt: skip


def resummarise(payload: dict, command: str) -> dict:
    """`payload` (an earlier run's JSON) with every ratio, interval and floor recomputed from its raw step times by
    this checkout's estimator (`ratio_estimate`); nothing is trained."""
    for shape in payload["shapes"].values():
        res = shape["results"]
        base = res[BASELINE]
        if "run_index" not in base:  # written before --from-json: which runs pair up is not recorded
            raise SystemExit("--from-json: this JSON predates run_index (each run's index among its shape's runs)")
        records = {}
        for name, e in res.items():  # each of the trainer's runs, paired with the baseline's run of the same index
            records[name] = [dict(step_s=s, baseline_step_s=base["step_s_per_run"][i], run=i,
                                  **{k: e[k] for k in ("activation_peak_bytes", "num_parameters", "off_policy",
                                                       "otb_energy_from_behaviour_forward")})
                             for s, i in zip(e["step_s_per_run"], e["run_index"])]  # fmt: skip
        targets, labels = {n: e["target_time_ratio"] for n, e in res.items()}, {n: e["label"] for n, e in res.items()}
        shape["results"] = res = summarise(records, targets, labels, payload["settings"]["cycle_steps"])
        shape["noise_floor"] = noise_floor(res[CONTROL])
    from .report import overhead_markdown

    payload["summarised_by"], payload["settings"]["timed"] = command, TIMED
    payload["table"] = overhead_markdown(payload)
    return payload


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


def plot(payload: dict, path: Path) -> Path | None:
    """Ratio bars with 95% intervals per shape, the noise floor as a grey band, targets as red dashes."""
    if (plt := common.pyplot()) is None:
        return None
    shapes = payload["shapes"]
    size = (5 + 0.6 * len(next(iter(shapes.values()))["results"]) * len(shapes), 4.8)
    fig, axes = plt.subplots(1, len(shapes), figsize=size, squeeze=False)
    for ax, (key, shape) in zip(axes[0], shapes.items()):
        names, nf = list(shape["results"]), shape["noise_floor"] or 0.0
        res = [shape["results"][n] for n in names]
        values = [e["time_ratio"] for e in res]
        low, high = ([e["time_ratio_ci95"][i] or e["time_ratio"] for e in res] for i in (0, 1))
        ax.bar(range(len(names)), values, yerr=[[v - lo for v, lo in zip(values, low)],
               [hi - v for v, hi in zip(values, high)]], capsize=2,
               color=["tab:gray" if n in (BASELINE, CONTROL) else "tab:blue" for n in names])  # fmt: skip
        for i, e in enumerate(res):
            if e.get("target_time_ratio"):
                ax.hlines(e["target_time_ratio"], i - 0.4, i + 0.4, colors="tab:red", linestyles="--")
            ax.text(i, values[i], f"{values[i]:.3f}", ha="center", va="bottom", fontsize=7)
        ax.axhspan(1.0 - nf, 1.0 + nf, color="tab:gray", alpha=0.2, linewidth=0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(max(0.0, min(low + [1.0 - nf]) - 0.05), max(high + [1.06, 1.0 + nf]) + 0.03)  # the bars' tops
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{key}: time / TRL's, 95% CI (grey: noise floor +-{nf:.1%})", fontsize=9)
    fig.suptitle(f"trl-groupopt {payload['benchmark']} ({payload['device']['description']}); red: targets", fontsize=9)
    return common.save_figure(fig, path, 120)


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
