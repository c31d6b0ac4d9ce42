"""Optimizer-step time (on CUDA also activation memory) of every trl-groupopt trainer against TRL's GRPOTrainer.

What is timed. Generation is identical across trainers (none of them touches it) and would dominate, so it is
replaced: each trainer's `_generate_single_turn` (the sampling call inside TRL's `_generate`) returns a fixed,
seeded batch of random completions (the same token ids for every trainer, a spread of lengths up to the completion
length, a quarter truncated without EOS). Everything after sampling runs unchanged through TRL's and our code:
decoding, the reward function (a cheap deterministic one), advantages, our subclasses' scoring hooks (group ids, raw
rewards), the behaviour-policy forward for `old_per_token_logps` (the schedule is off-policy, so OTB captures its
energy there, as in real training), the group-preserving shuffle, and then the optimizer steps through
`Trainer.train()`: `_compute_loss`, backward, gradient clipping, AdamW.

Which trainers. TRL's `GRPOTrainer` (the baseline, `trl_grpo`), then every method of the registry
(`trl_groupopt.METHODS`; its "grpo" entry, our base trainer with TRL's objective, is reported as `base`), then the
extra variants of `EXTRA_VARIANTS` (a data table: ECHO's "micro_batch" batch-ratio scope, the other DFPO transforms,
CTPO's geometric-mean ratio, CTPO and ECHO on OTB's advantages, ...), then `trl_grpo_again`, TRL's GRPOTrainer a second time: the A/A control. A
variant whose config field does not exist or whose value the config rejects is reported as "not available" with the
config's message, never a crash.

How. One *run* builds every trainer on a fresh copy of the same random weights and trains them all at once, each in
its own thread, in lockstep (`Lockstep`): exactly one trainer runs at a time, one optimizer step per turn, and the
order is rotated by one every round (no trainer runs two steps in a row). Step k of every trainer thus sees the same
batch and runs within one round of the others' step k, so a slow drift of a shared machine cancels in the paired ratio. `--warmup` steps are
untimed, then `--steps` are timed (rounded up to whole generation cycles); a callback reads the clock at each step's
start and end. The ratio of a trainer is `exp(mean log(cycle time / TRL GRPOTrainer's same cycle))` over every timed
generation cycle (its steps, scoring included) of every run, with its 95% Student-t interval. The *noise floor* is
how far from 1 the A/A control's interval reaches: the smallest difference the run can resolve. Every trainer of a
run is resident at once; `--group-size` (GPU default 3: Qwen2.5-0.5B with AdamW is ~6 GB a trainer) splits the
trainers into several runs, each with the baseline and the control, and a ratio pairs a trainer with the baseline of
its own run. Runs repeat once
per shape (`--shapes`, vocabulary x completion length), alternating the starting order, after at least
`--min-repeats`, until each shape's noise floor is below `--noise-target` (2%; a shape that got there is not repeated
any more, its time goes to the others), or `--max-repeats`, or the `--max-minutes` budget would be exceeded by one
more repeat. `time_ms` (median step without scoring + scoring
amortised per step) is printed for reading; the ratios do not use it. On CUDA the activation peak of each trainer's
timed steps is recorded (peak allocated minus allocated at the step's start); on the CPU one process holds every
trainer, so no per-trainer memory is measured.

Defaults. CPU (`--device cpu`): a tiny Qwen2 (hidden 32, 2 layers) with the vocabularies of Llama-2 (32,000,
completions up to 128 tokens) and Qwen2.5 (151,936, up to 64), one group of 4 per micro-batch, one micro-batch per
optimizer step and two per generation (off-policy), 2 warm-up + 16 timed steps per run, fp32, one torch thread. GPU
(`--device cuda`): Qwen2.5-0.5B's shapes with random weights, bf16, completions up to 512. `--smoke`: the task
tokenizer's ~70-token vocabulary, 24 tokens, a few steps. Outputs: `overhead_<device>.json` and `.png`
(`overhead_smoke.*` for --smoke); `python -m benchmarks.report` writes the results page's markdown table from the JSON.
On Linux/glibc, `python -m benchmarks.overhead` re-runs itself with `ALLOCATOR_TUNABLES` (one malloc arena for the
trainers' threads, large buffers kept, huge pages) unless GLIBC_TUNABLES already sets them; the JSON records it.

Usage (from the repo root):
    python -m benchmarks.overhead --smoke --output-dir outputs/bench        # CPU, < 1 min
    python -m benchmarks.overhead --device cpu --max-minutes 110      # the committed CPU measurement
    python -m benchmarks.overhead --device cuda                         # GPU
    python -m benchmarks.overhead --plot-from benchmarks/results/overhead_cpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import common

BASELINE = "trl_grpo"
#: A second TRL GRPOTrainer timed in every round: its ratio to the first is the noise floor (`noise_floor`).
CONTROL = "trl_grpo_again"
#: Time-ratio targets against TRL's GRPOTrainer, by registry method (issue 18). Variants inherit their method's.
METHOD_TARGETS: dict[str, float] = {
    "grpo": 1.01,
    "echo": 1.03,
    "dfpo": 1.03,
    "grpo_fix": 1.03,
    "ctpo": 1.03,
    "otb": 1.05,
}
NO_TARGET = object()  # a variant that is reported but not targeted
#: Registry methods whose DEFAULT configuration is reported, not targeted, and why. ECHO defaults to the paper's
#: batch_ratio_scope="step", which costs one extra no-grad forward per micro-batch by design; the ECHO target applies
#: to its "micro_batch" scope (EXTRA_VARIANTS).
REPORTED_ONLY_DEFAULTS: dict[str, str] = {"echo": "batch_ratio_scope='step' (default): one extra no-grad forward"}


@dataclass(frozen=True)
class Variant:
    """One trainer configuration to time: a registry method (None = TRL's GRPOTrainer) plus config overrides."""

    name: str
    method: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    target: Any = None  # None: the method's target; NO_TARGET: reported only


#: Configurations beside each registry method's defaults. A row whose knob is not in this checkout's config is
#: reported "not available" (the knob arrives with another branch); add rows freely.
EXTRA_VARIANTS: tuple[Variant, ...] = (
    Variant("echo_micro_batch", "echo", {"batch_ratio_scope": "micro_batch"}, "ECHO, batch ratio per micro-batch"),
    Variant("dfpo_orth_proj", "dfpo", {"dfpo_transform": "orth_proj"}, "DFPO orth_proj"),
    Variant("dfpo_orth_proj_unclipped", "dfpo", {"dfpo_transform": "orth_proj", "dfpo_orthogonal_over": "unclipped"},
            "DFPO orth_proj over unclipped tokens"),
    Variant("dfpo_orth_proj_qp", "dfpo", {"dfpo_transform": "orth_proj_qp"}, "DFPO orth_proj_qp (exact QP)"),
    Variant("ctpo_geomean", "ctpo", {"ctpo_ratio_mode": "geomean"}, "CTPO, geometric-mean prefix ratio"),
    # OTB's advantages under another objective: the energy capture is OTB's cost, so OTB's target
    Variant("ctpo+otb", "ctpo", {"advantage_estimator": "otb"}, "CTPO on OTB's advantages", METHOD_TARGETS["otb"]),
    Variant("echo+otb", "echo", {"advantage_estimator": "otb", "batch_ratio_scope": "micro_batch"},
            "ECHO (batch ratio per micro-batch) on OTB's advantages", METHOD_TARGETS["otb"]),
)  # fmt: skip


def variants() -> list[Variant]:
    """TRL's GRPOTrainer, every registered method with its defaults, then `EXTRA_VARIANTS` of registered methods."""
    from trl_groupopt import METHODS

    out = [Variant(BASELINE, None, {}, "TRL GRPOTrainer", NO_TARGET)]
    for key, spec in METHODS.items():
        name = "base" if key == "grpo" else key
        label = spec.trainer_class.__name__ + "".join(f" {k}={v}" for k, v in spec.config_defaults.items())
        if key == "grpo":
            label = "GroupOptTrainer (TRL's objective)"
        if key in REPORTED_ONLY_DEFAULTS:
            out.append(Variant(name, key, {}, f"{label} ({REPORTED_ONLY_DEFAULTS[key]})", NO_TARGET))
        else:
            out.append(Variant(name, key, {}, label))
    out += [v for v in EXTRA_VARIANTS if v.method in METHODS]
    # Last in the list, so ABBA puts it at the other end of each round from the baseline.
    out.append(Variant(CONTROL, None, {}, "TRL GRPOTrainer again (A/A control: the noise floor)", NO_TARGET))
    return out


def target_of(variant: Variant) -> float | None:
    if variant.target is NO_TARGET:
        return None
    if variant.target is not None:
        return float(variant.target)
    return METHOD_TARGETS.get(variant.method)


QWEN25_05B = dict(  # Qwen/Qwen2.5-0.5B config.json shapes
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip

# shapes: "VOCABxCOMPLETION" (vocab 0 = the task tokenizer's own ~70 tokens)
CPU_DEFAULTS = dict(steps=16, warmup=2, min_repeats=2, max_repeats=20, max_minutes=50.0, group_size=0,
                    shapes="32000x128,151936x64", prompt_length=32, batch_size=4, num_generations=4, grad_accum=1,
                    steps_per_generation=2, model="tiny")  # fmt: skip
GPU_DEFAULTS = dict(steps=20, warmup=4, min_repeats=2, max_repeats=4, max_minutes=9.0, group_size=3,
                    shapes="151936x512", prompt_length=128, batch_size=8, num_generations=4, grad_accum=2,
                    steps_per_generation=4, model="qwen2.5-0.5b")  # fmt: skip
SMOKE_DEFAULTS = dict(steps=4, warmup=2, min_repeats=1, max_repeats=1, max_minutes=5.0, group_size=4, shapes="0x24",
                      prompt_length=16, batch_size=4, num_generations=4, grad_accum=1, steps_per_generation=2,
                      model="tiny")  # fmt: skip


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in text.split(","):
        vocab, _, length = part.strip().lower().partition("x")
        if not length:
            raise ValueError(f"--shapes entries are VOCABxCOMPLETION (e.g. 32000x256), got {part!r}")
        shapes.append((int(vocab), int(length)))
    return shapes


def shape_key(vocab: int, length: int) -> str:
    return f"v{vocab or 'task'}_t{length}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Optimizer-step time of TRL's GRPOTrainer vs every trl-groupopt trainer and variant "
        "(generation replaced by fixed random completions; see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR, help="Where JSON and PNG go.")
    parser.add_argument("--smoke", action="store_true", help="Task-sized model and vocabulary on CPU (< 1 min).")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--trainers", help="Comma-separated subset of the variant names (default: all).")
    parser.add_argument("--shapes", help="Comma-separated VOCABxCOMPLETION_LENGTH (default: per device).")
    parser.add_argument("--steps", type=int, help="Timed optimizer steps per trainer run.")
    parser.add_argument("--warmup", type=int, help="Untimed optimizer steps first.")
    parser.add_argument("--min-repeats", type=int, help="Repeats (ABBA) before the noise rule may stop.")
    parser.add_argument("--max-repeats", type=int, help="Repeats at most.")
    parser.add_argument(
        "--repeats", type=int, help="Exactly this many repeats (sets --min-repeats and --max-repeats)."
    )
    parser.add_argument("--group-size", type=int,
                        help="Trainers per lockstep run besides TRL GRPOTrainer and the A/A control (0: all at once; "
                             "a GPU holds every trainer of a run at once).")  # fmt: skip
    parser.add_argument("--noise-target", type=float, default=0.02,
                        help="Stop once the A/A control's 95%% interval lies within 1 +- this.")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, help="No repeat starts that would end past this budget.")
    parser.add_argument("--model", choices=["qwen2.5-0.5b", "tiny"], help="Model shapes.")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                        help="auto = bf16 on CUDA, fp32 on CPU.")  # fmt: skip
    parser.add_argument("--prompt-length", type=int, help="Prompt length in tokens.")
    parser.add_argument("--batch-size", type=int, help="per_device_train_batch_size: sequences per micro-batch.")
    parser.add_argument("--num-generations", type=int, help="Group size G.")
    parser.add_argument("--grad-accum", type=int, help="Micro-batches per optimizer step.")
    parser.add_argument(
        "--steps-per-generation", type=int, help="Micro-batches per generation (2x grad-accum: off-policy)."
    )
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="TRL's default; off here, which shortens the step and makes any overhead more visible.")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-affinity", help="Pin to these CPUs, e.g. 0-1 (Linux), when sharing the machine.")
    parser.add_argument("--plot-from", type=Path, help="Only re-draw the PNG from an existing JSON.")
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)  # recorded as the command when main() is called in-process
    if args.smoke and args.device == "auto":
        args.device = "cpu"
    if args.device == "auto" and not args.plot_from:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = SMOKE_DEFAULTS if args.smoke else (GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS)
    if args.repeats is not None:
        args.min_repeats = args.max_repeats = args.repeats
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.shape_list = parse_shapes(args.shapes)
    if args.batch_size % args.num_generations:
        parser.error("--batch-size must be a multiple of --num-generations (DFPO and OTB need whole groups).")
    # Whole generation cycles: the scoring (once per cycle) is then amortised exactly.
    cycle = max(1, args.steps_per_generation // args.grad_accum)
    args.cycle_steps = cycle
    args.warmup = -(-max(args.warmup, 1) // cycle) * cycle
    args.steps = -(-max(args.steps, 1) // cycle) * cycle
    args.output_stem = "overhead_smoke" if args.smoke else f"overhead_{args.device}"
    return args


# ------------------------------------------------------------------------------------------------ the workload
def synthetic_reward(completions, completion_ids, **kwargs) -> list[float]:
    """Deterministic pseudo-random reward in [0, 1) from the token ids: cheap, the same for every trainer, and with
    non-zero spread inside groups so every objective's clipping and re-weighting code runs."""
    rewards = []
    for ids in completion_ids:
        h = 0
        for i, tok in enumerate(ids):
            h = (h * 31 + (i + 1) * int(tok)) % 1_000_003
        rewards.append((h % 997) / 997.0)
    return rewards


def make_prompts(num: int, prompt_length: int, seed: int):
    """The arithmetic task's prompts, each padded with filler text to about `prompt_length` tokens (the in-code
    tokenizer is character-level, so characters ~ tokens)."""
    from trl_groupopt.offline import make_arithmetic_dataset

    dataset = make_arithmetic_dataset(num, seed=seed, split="train")
    filler = "think about each step and check the sum before you answer. "

    def pad(row):
        content = row["prompt"][-1]["content"]
        extra = max(0, prompt_length - len(content) - 4)  # bos, role marker, newline, assistant marker
        text = (filler * (extra // len(filler) + 1))[:extra] + content
        return {"prompt": [{"role": "user", "content": text}]}

    return dataset.map(pad)


def make_fake_sampler(tokenizer, completion_length: int, seed: int):
    """A stand-in for `GRPOTrainer._generate_single_turn`: the n-th call returns the n-th fixed batch of random
    completions (seeded by n alone, so every trainer sees the same ones). Lengths are uniform in
    [completion_length // 4, completion_length]; a quarter are cut at the maximum without EOS (TRL's "clipped"),
    the rest end with EOS (which TRL's transformers path keeps in the completion)."""
    import torch

    specials = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in specials]
    vocab_t = torch.tensor(vocab)
    eos = tokenizer.eos_token_id
    calls = {"n": 0}

    def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        g = torch.Generator().manual_seed(seed * 1_000_003 + calls["n"])
        calls["n"] += 1
        n = len(prompt_ids)
        lengths = torch.randint(max(1, completion_length // 4), completion_length + 1, (n,), generator=g)
        truncated = torch.rand(n, generator=g) < 0.25
        lengths[truncated] = completion_length
        completions = []
        for i in range(n):
            length = int(lengths[i])
            ids = vocab_t[torch.randint(0, len(vocab), (length,), generator=g)].tolist()
            if not truncated[i]:
                ids[-1] = eos
            completions.append(ids)
        return completions, None

    return generate_single_turn


_TEMPLATES: dict[tuple, Any] = {}


def build_model(args, tokenizer, device: str, dtype):
    """A fresh copy of the benchmark model on `device`: the same random weights for every trainer (built once on the
    CPU from a seeded config, then deep-copied, so no trainer sees another's updates and no RNG state leaks)."""
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    key = (args.model, args.vocab_size, str(dtype), args.seed)
    if key not in _TEMPLATES:
        shapes = dict(QWEN25_05B if args.model == "qwen2.5-0.5b" else TINY)
        shapes.setdefault("vocab_size", len(tokenizer))
        if args.vocab_size:
            shapes["vocab_size"] = args.vocab_size
        if shapes["vocab_size"] < len(tokenizer):
            raise SystemExit(f"--vocab-size must be >= the tokenizer's {len(tokenizer)} tokens")
        config = Qwen2Config(
            **shapes,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(args.seed)
        template = Qwen2ForCausalLM(config).to(dtype)
        template.generation_config.pad_token_id = tokenizer.pad_token_id
        template.generation_config.eos_token_id = tokenizer.eos_token_id
        _TEMPLATES[key] = template
    return copy.deepcopy(_TEMPLATES[key]).to(device)


def classes(variant: Variant):
    """(config factory, trainer class) of a variant: TRL's own for the baseline, else the registry's."""
    if variant.method is None:
        import trl

        return trl.GRPOConfig, trl.GRPOTrainer
    from trl_groupopt import get_method

    spec = get_method(variant.method)
    return spec.make_config, spec.trainer_class


def config_kwargs_for(variant: Variant, args, device: str, dtype, workdir: str) -> dict[str, Any]:
    """The shared settings (the same for every trainer), then the variant's overrides."""
    import torch

    from trl_groupopt.cli import DEMO_DEFAULTS

    total_steps = args.warmup + args.steps
    kwargs = dict(
        # from the demo: constant schedule, no KL, sampling temperature, quiet trainer
        **{
            k: DEMO_DEFAULTS[k]
            for k in ("lr_scheduler_type", "beta", "temperature", "save_strategy", "report_to", "disable_tqdm")
        },  # fmt: skip
        output_dir=os.path.join(workdir, variant.name),
        learning_rate=1e-6,  # random weights: any small value; the same for all
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        gradient_accumulation_steps=args.grad_accum,
        steps_per_generation=args.steps_per_generation,
        max_completion_length=args.completion_length,
        max_steps=total_steps,
        logging_steps=total_steps + 1,  # no logging inside the timed steps (identical for all trainers anyway)
        seed=args.seed,
        use_cpu=device == "cpu",
        bf16=dtype == torch.bfloat16,
        gradient_checkpointing=args.gradient_checkpointing,
        dataloader_num_workers=0,
    )
    kwargs.update(variant.overrides)
    return kwargs


def availability(variant: Variant, args, device: str, dtype) -> str | None:
    """None if this checkout can build the variant's config, else why not (unknown field, rejected value)."""
    make_config, _ = classes(variant)
    try:
        make_config(**config_kwargs_for(variant, args, device, dtype, tempfile.gettempdir()))
    except (TypeError, ValueError) as error:  # dataclass: unexpected keyword; __post_init__: rejected value
        return f"not available: {type(error).__name__}: {error}".splitlines()[0][:300]
    return None


class Lockstep:
    """Turns for the trainers' threads: exactly one runs at a time, one optimizer step per turn, in `order`, which is
    rotated by one after every round. Every trainer's step k therefore runs within one round of the others' step k,
    so a slow drift of the machine (other tenants of the host, clock changes) affects the paired steps alike and
    cancels in their ratio, which sequential whole runs cannot do. Rotation, not reversal (ABBA): reversing would let
    the first and last trainers run two steps in a row, the second with warm caches (measured: a 3-5% bias between
    two identical trainers); rotated, every step follows another trainer's, and each trainer takes every position."""

    def __init__(self, names: list[str], on_round=None):
        self.order = list(names)
        self.pos = 0
        self.started = False
        self.on_round = on_round  # called between rounds, when no trainer is inside a step
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
            if name not in self.order:
                return
            index = self.order.index(name)
            del self.order[index]
            if index < self.pos:
                self.pos -= 1
            self._wrap()

    def _wrap(self) -> None:
        if self.order and self.pos >= len(self.order):
            self.pos = 0
            self.order = self.order[1:] + self.order[:1]
            if self.on_round is not None:
                self.on_round()
        self.cond.notify_all()


def build_trainer(variant: Variant, args, device: str, dtype, tokenizer, dataset, workdir: str):
    """One trainer on a fresh copy of the model, generation replaced by the fixed sampler, scoring timed: returns
    the trainer, its (empty) timing record and `pending`, the current step's scoring time and start clock."""
    from transformers import PrinterCallback

    make_config, trainer_cls = classes(variant)
    config = make_config(**config_kwargs_for(variant, args, device, dtype, workdir))
    model = build_model(args, tokenizer, device, dtype)
    trainer = trainer_cls(model=model, reward_funcs=synthetic_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer)  # fmt: skip
    trainer._generate_single_turn = make_fake_sampler(tokenizer, args.completion_length, args.seed)
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics dict: noise in this benchmark's output
    record: dict[str, Any] = {"step_s": [], "scoring_s": [], "activation_peak_bytes": None}
    pending = {"scoring": 0.0, "t0": 0.0}
    score = trainer._generate_and_score_completions  # bound: the most derived class's method

    def timed_scoring(inputs):
        common.synchronize(device)
        t0 = time.perf_counter()
        out = score(inputs)
        common.synchronize(device)
        pending["scoring"] += time.perf_counter() - t0
        return out

    trainer._generate_and_score_completions = timed_scoring
    return trainer, record, pending


def run_trainers(variants: list[Variant], args, device: str, dtype, tokenizer, dataset, workdir: str,
                 profile: bool = False) -> dict[str, dict]:  # fmt: skip
    """Train every variant for warmup + steps optimizer steps, in lockstep (`Lockstep`), and return their timings:
    `step_s` / `scoring_s` per timed step (step k of every trainer sees the same batch), and on CUDA the activation
    peak (peak allocated during a timed step minus allocated at its start; on CPU one process holds every trainer,
    so no per-trainer memory is measured).

    With `profile` (one variant only), the timed steps run under `torch.profiler` and `record["ops"]` maps each op
    to its call count and self CPU time (the input of `benchmarks.profile_step`)."""
    import torch

    if profile and len(variants) != 1:
        raise ValueError("profile one variant at a time")
    built = {v.name: build_trainer(v, args, device, dtype, tokenizer, dataset, workdir) for v in variants}
    turns = Turns(Lockstep(list(built), on_round=gc.collect), {name: threading.Event() for name in built}, device,
                  args.warmup, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile
                  else None)  # fmt: skip
    for name, (trainer, record, pending) in built.items():
        trainer.add_callback(step_timer(turns, name, record, pending))
    train_in_lockstep({name: trainer for name, (trainer, _, _) in built.items()}, turns)
    if turns.profiler is not None:
        turns.profiler.__exit__(None, None, None)
    records = {name: finish_record(trainer, record, turns.profiler) for name, (trainer, record, _) in built.items()}
    del built  # the scoring wrappers and the trainers form cycles: gc.collect() below frees them
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return records


@dataclass
class Turns:
    """What the trainers' threads of one lockstep run share: the turns, a flag per trainer set when its set-up is
    done, the device, the untimed warm-up steps and the profiler (started after the warm-up; None: no profile)."""

    lockstep: Lockstep
    ready: dict[str, threading.Event]
    device: str
    warmup: int
    profiler: Any = None


def step_timer(turns: Turns, name: str, record: dict, pending: dict):
    """The callback that times each optimizer step of trainer `name` into `record` and takes one lockstep turn per
    step (`pending`: the current step's scoring time and start clock, filled by the scoring wrapper)."""
    import torch
    from transformers import TrainerCallback

    device = turns.device

    class StepTimer(TrainerCallback):
        def on_train_begin(self, _args, state, control, **kwargs):
            turns.ready[name].set()
            turns.lockstep.acquire(name)  # from here on this thread runs only in its turns

        def on_step_begin(self, _args, state, control, **kwargs):
            common.synchronize(device)
            pending["scoring"] = 0.0
            self.start_bytes = torch.cuda.memory_allocated() if device == "cuda" else None
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            pending["t0"] = time.perf_counter()

        def on_step_end(self, _args, state, control, **kwargs):
            common.synchronize(device)
            elapsed = time.perf_counter() - pending["t0"]
            if state.global_step > turns.warmup:
                record["step_s"].append(elapsed)
                record["scoring_s"].append(pending["scoring"])
                if device == "cuda":
                    peak = torch.cuda.max_memory_allocated() - self.start_bytes
                    record["activation_peak_bytes"] = max(record["activation_peak_bytes"] or 0, peak)
            elif state.global_step == turns.warmup and turns.profiler is not None:
                turns.profiler.__enter__()
            if state.global_step < state.max_steps:  # the last turn ends in on_train_end, after train()'s wrap-up
                turns.lockstep.release(name)
                turns.lockstep.acquire(name)

        def on_train_end(self, _args, state, control, **kwargs):
            turns.lockstep.leave(name)

    return StepTimer()


def train_in_lockstep(trainers: dict[str, Any], turns: Turns) -> None:
    """Train every trainer in its own thread, one step per turn; re-raises the first failure here. A single trainer
    trains in this thread (torch.profiler must start and stop in one thread)."""
    errors: dict[str, BaseException] = {}

    def train(name: str, trainer) -> None:
        try:
            trainer.train()
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread below
            errors[name] = error
            turns.ready[name].set()
        finally:
            turns.lockstep.leave(name)

    gc.collect()
    gc.disable()  # collections run between rounds only (Lockstep.on_round), never inside a timed step
    try:
        if len(trainers) == 1:
            turns.lockstep.start()
            ((name, trainer),) = trainers.items()
            train(name, trainer)
        else:
            threads = []
            for name, trainer in trainers.items():
                thread = threading.Thread(target=train, args=(name, trainer), name=f"overhead-{name}", daemon=True)
                thread.start()
                turns.ready[name].wait()  # set-ups one at a time: none overlaps another's (untimed, but CPU-bound)
                threads.append(thread)
            turns.lockstep.start()
            for thread in threads:
                thread.join()
    finally:
        gc.enable()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"trainer {name!r} failed in the overhead benchmark") from error


def finish_record(trainer, record: dict, profiler) -> dict:
    """A trained trainer's timing record, with the profile's op table and what its last batch shows (off-policy,
    OTB's energy from the behaviour forward) and its parameter count."""
    if profiler is not None:
        record["ops"] = {e.key: {"count": e.count, "self_cpu_us": e.self_cpu_time_total,
                                 "cpu_us": e.cpu_time_total} for e in profiler.key_averages()}  # fmt: skip
    buffered = trainer._buffered_inputs[0] if trainer._buffered_inputs else {}
    record.update(
        off_policy=buffered.get("old_per_token_logps") is not None,
        otb_energy_from_behaviour_forward="old_per_token_energy" in buffered,
        num_parameters=sum(p.numel() for p in trainer.model.parameters()),
    )
    return record


def lockstep_groups(order: list[Variant], group_size: int) -> list[list[Variant]]:
    """The lockstep runs of one repeat: every trainer besides the baseline and the control in chunks of
    `group_size` (0: all in one run), each run holding the baseline and the control too, in `order`."""
    fixed = {BASELINE, CONTROL}
    others = [v for v in order if v.name not in fixed]
    size = group_size or max(1, len(others))
    chunks = [others[i : i + size] for i in range(0, len(others), size)] or [[]]
    return [[v for v in order if v.name in fixed or v in chunk] for chunk in chunks]


def repeat_time_ms(record: dict) -> float:
    """One run's time per optimizer step: median step without scoring + scoring amortised per step."""
    train_only = [a - b for a, b in zip(record["step_s"], record["scoring_s"])]
    return 1e3 * (common.median(train_only) + sum(record["scoring_s"]) / len(record["scoring_s"]))


def cycle_log_ratios(runs: list[dict], cycle: int) -> list[float]:
    """log(time of a trainer's generation cycle / the baseline's same cycle in the same lockstep run), over every
    timed cycle of every run (`run["baseline_step_s"]`: the baseline's step times in that run).

    A cycle (`steps_per_generation / gradient_accumulation_steps` optimizer steps) holds one scoring call, so its
    time is the whole cost of those steps; cycle k of two trainers in one run saw the same batches and ran within
    one lockstep round of each other, so the pair is as close in time and content as the design allows."""
    out = []
    for run in runs:
        a, b = run["step_s"], run["baseline_step_s"]
        for k in range(0, min(len(a), len(b)) - cycle + 1, cycle):
            out.append(math.log(sum(a[k : k + cycle]) / sum(b[k : k + cycle])))
    return out


def ratio_estimate(log_ratios: list[float]) -> dict[str, Any]:
    """exp of the mean log ratio with its 95% Student-t interval: a geometric-mean time ratio."""
    stats = common.mean_ci(log_ratios)
    out = {"n_cycles": stats["n"], "ratio": None, "low": None, "high": None}
    if stats["mean"] is not None:
        out["ratio"] = math.exp(stats["mean"])
    if stats["low"] is not None:
        out["low"], out["high"] = math.exp(stats["low"]), math.exp(stats["high"])
    return out


def noise_floor(control: dict[str, Any]) -> float | None:
    """How far from 1 a trainer identical to the baseline is measured: the larger distance from 1 of the bounds of
    the A/A control's 95% interval (`CONTROL`, a second TRL GRPOTrainer timed in every round). None without one."""
    low, high = control["time_ratio_ci95"]
    return None if low is None else max(high - 1.0, 1.0 - low)


def summarise(records: dict[str, list[dict]], targets: dict[str, float | None], labels: dict[str, str],
              cycle: int) -> dict[str, dict]:  # fmt: skip
    """Pool the repeats of each trainer (one shape) and compute the paired time ratios to TRL's GRPOTrainer."""
    out: dict[str, dict] = {}
    for name, runs in records.items():
        step = [s for r in runs for s in r["step_s"]]
        scoring = [s for r in runs for s in r["scoring_s"]]
        train_ms = 1e3 * common.median([a - b for a, b in zip(step, scoring)])
        scoring_ms = 1e3 * sum(scoring) / len(scoring)
        estimate = ratio_estimate(cycle_log_ratios(runs, cycle))
        per_repeat = [ratio_estimate(cycle_log_ratios([run], cycle))["ratio"] for run in runs]
        target = targets.get(name)
        peaks = [r["activation_peak_bytes"] for r in runs if r.get("activation_peak_bytes") is not None]
        out[name] = {
            "label": labels[name],
            "time_ms": train_ms + scoring_ms,
            "train_time_ms": train_ms,
            "scoring_ms_per_step": scoring_ms,
            "time_ms_per_repeat": [repeat_time_ms(r) for r in runs],
            "timed_steps": len(step),
            "time_ratio": estimate["ratio"],
            "time_ratio_ci95": [estimate["low"], estimate["high"]],
            "paired_cycles": estimate["n_cycles"],
            "time_ratio_per_run": per_repeat,
            "activation_peak_bytes": max(peaks) if peaks else None,
            "num_parameters": runs[0]["num_parameters"],
            "off_policy": runs[0]["off_policy"],
            "otb_energy_from_behaviour_forward": runs[0]["otb_energy_from_behaviour_forward"],
            "target_time_ratio": target,
            "meets_time_target": None if target is None else estimate["ratio"] <= target,
            "target_cleared_at_95": None if target is None or estimate["high"] is None else estimate["high"] <= target,
        }
    base_peak = out[BASELINE]["activation_peak_bytes"]
    for entry in out.values():
        peak = entry["activation_peak_bytes"]
        entry["activation_memory_ratio"] = peak / base_peak if peak and base_peak else None
    return out


def print_results(payload: dict) -> str:
    rows = []
    for key, shape in payload["shapes"].items():
        for name, e in shape["results"].items():
            tt = e["target_time_ratio"]
            verdict = "" if tt is None else ("ok" if e["meets_time_target"] else "OVER")
            low, high = e["time_ratio_ci95"]
            rows.append([key, name, f"{e['time_ms']:.1f}", f"{e['time_ratio']:.3f}x",
                         f"[{low:.3f}, {high:.3f}]" if low is not None else "-",
                         f"<={tt:.2f}x {verdict}" if tt else "-", f"{e['scoring_ms_per_step']:.1f}",
                         common.format_bytes(e["activation_peak_bytes"])])  # fmt: skip
        for name, why in payload["not_available"].items():
            rows.append([key, name, "-", "n/a", "-", "-", "-", why[:60]])
    print()
    text = common.print_table(
        ["shape", "trainer", "step ms", "x TRL GRPO", "95% CI", "target", "scoring ms/step", "activation peak"], rows
    )
    for key, shape in payload["shapes"].items():
        nf = shape["noise_floor"]
        print(f"noise floor {key}: a second TRL GRPOTrainer is measured within "
              + (f"+-{nf:.1%}" if nf is not None else "n/a (too few cycles)") + " of the first")  # fmt: skip
    if payload["smoke"]:
        print("(smoke run: task-sized model on CPU; the ratios and targets are not meaningful here)")
    return text


def plot(payload: dict, path: Path) -> Path | None:
    plt = common.pyplot()
    if plt is None:
        return None
    shapes = payload["shapes"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(max(8, 0.9 * len(next(iter(shapes.values()))["results"]) + 3)
                                                      * len(shapes) / 1.5, 4.8), squeeze=False)  # fmt: skip
    for ax, (key, shape) in zip(axes[0], shapes.items()):
        results = shape["results"]
        names = list(results)
        values = [results[n]["time_ratio"] for n in names]
        errors = [[v - (results[n]["time_ratio_ci95"][0] or v) for n, v in zip(names, values)],
                  [(results[n]["time_ratio_ci95"][1] or v) - v for n, v in zip(names, values)]]  # fmt: skip
        colors = ["tab:gray" if n in (BASELINE, CONTROL) else "tab:blue" for n in names]
        ax.bar(range(len(names)), values, color=colors, yerr=errors, capsize=2)
        for i, n in enumerate(names):
            target = results[n].get("target_time_ratio")
            if target:
                ax.hlines(target, i - 0.4, i + 0.4, colors="tab:red", linestyles="--")
            ax.text(i, values[i], f"{values[i]:.3f}", ha="center", va="bottom", fontsize=7)
        nf = shape["noise_floor"] or 0.0
        ax.axhspan(1.0 - nf, 1.0 + nf, color="tab:gray", alpha=0.2, linewidth=0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        tops = [v + e for v, e in zip(values, errors[1])]
        ax.set_ylim(max(0.0, min(values + [1.0 - nf]) - 0.05), max(tops + [1.06, 1.0 + nf]) + 0.03)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{key}: step time / TRL GRPOTrainer, 95% CI (grey band: noise floor +-{nf:.1%})", fontsize=9)
    fig.suptitle(f"trl-groupopt overhead ({payload['device']['description']}); red dashes: targets", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.plot_from:
        payload = json.loads(args.plot_from.read_text())
        out = plot(payload, args.output_dir / (args.plot_from.stem + ".png"))
        print(f"wrote {out}")
        return payload
    common.set_cpu_affinity(args.cpu_affinity)
    common.setup_environment()
    device = common.resolve_device(args.device)
    import torch
    import transformers

    from trl_groupopt.offline import build_tokenizer

    transformers.logging.set_verbosity_error()
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(
        args.dtype, torch.bfloat16 if device == "cuda" else torch.float32
    )
    runnable, not_available = select_variants(args, device, dtype)
    generation_batch = args.batch_size * args.steps_per_generation
    num_prompts = generation_batch // args.num_generations * -(-(args.warmup + args.steps) // args.cycle_steps) + 8
    workload = Workload(args, device, dtype, build_tokenizer(), make_prompts(max(num_prompts, 64), args.prompt_length,
                                                                             args.seed))  # fmt: skip
    print(f"device: {common.describe_device(device)['description']}; trainers: {[v.name for v in runnable]}; "
          f"shapes: {list(workload.shapes)}; {args.warmup} warm-up + {args.steps} timed steps per run, all trainers "
          f"in lockstep; {args.min_repeats}-{args.max_repeats} repeats until the noise floor < "
          f"{args.noise_target:.0%} or {args.max_minutes} min", flush=True)  # fmt: skip
    progress = Progress(runnable, not_available, list(workload.shapes))
    with tempfile.TemporaryDirectory(prefix="overhead-") as workdir:
        run_repeats(workload, progress, workdir)
    payload = build_payload(args, device, dtype, progress)
    payload["table"] = print_results(payload)
    print(f"stopped: {progress.stop_reason}")
    json_path = common.write_json(args.output_dir / f"{args.output_stem}.json", payload)
    png_path = plot(payload, args.output_dir / f"{args.output_stem}.png")
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    return payload


def select_variants(args, device: str, dtype) -> tuple[list[Variant], dict[str, str]]:
    """The variants `--trainers` asks for (always with the baseline and the control), split into those this checkout
    can build and the others, with the reason."""
    all_variants = variants()
    if args.trainers:
        wanted = {t.strip() for t in args.trainers.split(",") if t.strip()} | {BASELINE, CONTROL}
        unknown = wanted - {v.name for v in all_variants}
        if unknown:
            raise SystemExit(f"unknown trainer(s) {sorted(unknown)}; choose from {[v.name for v in all_variants]}")
        all_variants = [v for v in all_variants if v.name in wanted]
    first_shape = argparse.Namespace(**{**vars(args), "completion_length": args.shape_list[0][1]})
    not_available = {v.name: why for v in all_variants if (why := availability(v, first_shape, device, dtype))}
    for name, why in not_available.items():
        print(f"  {name}: {why}", flush=True)
    return [v for v in all_variants if v.name not in not_available], not_available


@dataclass
class Workload:
    """What every lockstep run of the benchmark trains on: the flags, the device and dtype, the tokenizer, the
    prompts, and the flags per shape (`shapes`: shape key -> the flags with its vocabulary and completion length)."""

    args: Any
    device: str
    dtype: Any
    tokenizer: Any
    dataset: Any
    shapes: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.shapes = {
            shape_key(v, t): argparse.Namespace(**{**vars(self.args), "vocab_size": v or None, "completion_length": t})
            for v, t in self.args.shape_list
        }


@dataclass
class Progress:
    """What the repeats measured so far: per shape and trainer the timing record of each run, the seconds of each
    repeat and of each shape's part of it, the shapes whose noise floor is below the target, and why they stopped."""

    runnable: list[Variant]
    not_available: dict[str, str]
    shape_keys: list[str]
    started: float = field(default_factory=time.perf_counter)
    records: dict[str, dict[str, list[dict]]] = field(init=False)
    repeat_seconds: list[float] = field(default_factory=list)
    shape_seconds: dict[str, list[float]] = field(init=False)
    resolved: set[str] = field(default_factory=set)
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        self.records = {key: {v.name: [] for v in self.runnable} for key in self.shape_keys}
        self.shape_seconds = {key: [] for key in self.shape_keys}

    def next_repeat_ends_past(self, pending: list[str], max_minutes: float) -> bool:
        """Whether one more repeat of the `pending` shapes, each as long as its longest so far, would end past
        `max_minutes` (never before the first repeat)."""
        if not self.repeat_seconds:
            return False
        ahead = sum(max(self.shape_seconds[key]) for key in pending)
        return time.perf_counter() - self.started + ahead > 60 * max_minutes


def run_repeats(workload: Workload, progress: Progress, workdir: str) -> None:
    """Repeat the lockstep runs of every unresolved shape until each noise floor is below the target (after
    --min-repeats), --max-repeats, or another repeat would end past --max-minutes; write the JSON after each."""
    args = workload.args
    for repeat in range(args.max_repeats):
        pending = [key for key in workload.shapes if key not in progress.resolved]
        if progress.next_repeat_ends_past(pending, args.max_minutes):
            progress.stop_reason = f"time budget: another repeat would end past --max-minutes {args.max_minutes}"
            return
        t_repeat = time.perf_counter()
        # Repeats alternate the starting order too, so no trainer is always first in a round.
        order = progress.runnable if repeat % 2 == 0 else list(reversed(progress.runnable))
        for key in pending:
            t_shape = time.perf_counter()
            run_shape(workload, progress, key, order, repeat, workdir)
            progress.shape_seconds[key].append(time.perf_counter() - t_shape)
        progress.repeat_seconds.append(time.perf_counter() - t_repeat)
        payload = build_payload(args, workload.device, workload.dtype, progress)
        common.write_json(args.output_dir / f"{args.output_stem}.json", payload)  # a cut-short run keeps numbers
        floors = {key: shape["noise_floor"] for key, shape in payload["shapes"].items()}
        print(f"  repeat {repeat + 1} done in {progress.repeat_seconds[-1]:.0f} s; noise floor per shape: "
              + ", ".join(f"{key} " + ("n/a" if f is None else f"{f:.1%}") for key, f in floors.items()),
              flush=True)  # fmt: skip
        if repeat + 1 >= args.min_repeats:  # a shape whose floor is below the target gives its time to the others
            progress.resolved |= {key for key, f in floors.items() if f is not None and f < args.noise_target}
        if progress.resolved >= set(workload.shapes):
            progress.stop_reason = f"noise floor below {args.noise_target:.0%} for every shape"
            return
    progress.stop_reason = f"--max-repeats {args.max_repeats} reached"


def run_shape(workload: Workload, progress: Progress, key: str, order: list[Variant], repeat: int,
              workdir: str) -> None:  # fmt: skip
    """One shape of one repeat: every lockstep group, each paired with the baseline of its own run."""
    for group in lockstep_groups(order, workload.args.group_size):
        t0 = time.perf_counter()
        by_name = run_trainers(group, workload.shapes[key], workload.device, workload.dtype, workload.tokenizer,
                               workload.dataset, workdir)  # fmt: skip
        for name, record in by_name.items():
            record["baseline_step_s"] = by_name[BASELINE]["step_s"]  # the pair of every ratio
            progress.records[key][name].append(record)
        print(f"  [{repeat + 1}] {key}: {time.perf_counter() - t0:.0f} s; ms/step "
              + ", ".join(f"{n} {repeat_time_ms(r):.0f}" for n, r in by_name.items()), flush=True)  # fmt: skip


def build_payload(args, device: str, dtype, progress: Progress) -> dict:
    """overhead_<device>.json: the settings, and per shape every trainer's paired ratio to TRL's GRPOTrainer."""
    targets = {v.name: target_of(v) for v in progress.runnable}
    labels = {v.name: v.label for v in progress.runnable}
    shapes = {}
    for key, by_trainer in progress.records.items():
        done = {name: runs for name, runs in by_trainer.items() if runs}
        if BASELINE not in done:
            continue
        vocab, length = args.shape_list[list(progress.records).index(key)]
        results = summarise(done, targets, labels, args.cycle_steps)
        shapes[key] = {
            "vocab_size": vocab or None,
            "completion_length": length,
            "noise_floor": noise_floor(results[CONTROL]) if CONTROL in results else None,
            "repeats": len(progress.shape_seconds[key]),
            "repeat_seconds": progress.shape_seconds[key],
            "results": results,
        }
    return {
        "benchmark": "overhead",
        "device": common.describe_device(device),
        "command": common.command_line("benchmarks.overhead", args.argv),
        "environment": {k: os.environ[k] for k in ("GLIBC_TUNABLES", "OMP_NUM_THREADS") if k in os.environ},
        "smoke": args.smoke,
        "settings": {
            "model": args.model,
            "dtype": str(dtype).replace("torch.", ""),
            "shapes": args.shapes,
            "prompt_length": args.prompt_length,
            "per_device_train_batch_size": args.batch_size,
            "num_generations": args.num_generations,
            "gradient_accumulation_steps": args.grad_accum,
            "steps_per_generation": args.steps_per_generation,
            "gradient_checkpointing": args.gradient_checkpointing,
            "warmup_steps": args.warmup,
            "timed_steps": args.steps,
            "cycle_steps": args.cycle_steps,
            "group_size": args.group_size,
            "min_repeats": args.min_repeats,
            "max_repeats": args.max_repeats,
            "noise_target": args.noise_target,
            "max_minutes": args.max_minutes,
            "seed": args.seed,
            "timed": "optimizer steps through Trainer.train() with generation replaced by fixed random completions, "
            "every trainer in its own thread in lockstep (one step per turn, the order rotated every round); "
            "time_ratio = exp(mean over generation cycles and repeats of log(cycle time / TRL GRPOTrainer's same "
            "cycle)) with its 95% Student-t interval; time_ms = median step time without scoring + scoring "
            "amortised per step (for reading only)",
            "noise_floor": f"max distance from 1 of the 95% interval of {CONTROL} (a second TRL GRPOTrainer) / "
            f"{BASELINE}",
        },  # fmt: skip
        "baseline": BASELINE,
        "control": CONTROL,
        "variants": {
            v.name: {"method": v.method, "overrides": v.overrides, "label": v.label} for v in progress.runnable
        },  # fmt: skip
        "not_available": progress.not_available,
        "repeats_done": len(progress.repeat_seconds),
        "repeat_seconds": progress.repeat_seconds,
        "stop_reason": progress.stop_reason,
        "memory_kind": "cuda activation peak per timed step" if device == "cuda" else "not measured on CPU",
        "wall_s": time.perf_counter() - progress.started,
        "shapes": shapes,
    }


#: glibc malloc settings for this benchmark (Linux): one arena, so the trainers' threads allocate from the main heap
#: (a thread arena serves no chunk above 64 MiB: every logits buffer would be mmap'd and page-faulted anew each step,
#: measured 2.5-4.7x slower scoring in a thread than in the main thread), large buffers kept instead of returned and
#: re-faulted, transparent huge pages. Fixed at process start, hence `reexec_with_allocator_settings`.
ALLOCATOR_TUNABLES = (
    "glibc.malloc.arena_max=1:glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4294967296:"
    "glibc.malloc.trim_threshold=4294967296"
)


def reexec_with_allocator_settings() -> None:
    """Re-run this command with `ALLOCATOR_TUNABLES` when GLIBC_TUNABLES does not set them (Linux, glibc only)."""
    import platform
    import sys

    if (
        platform.system() != "Linux"
        or platform.libc_ver()[0] != "glibc"
        or "arena_max" in os.environ.get("GLIBC_TUNABLES", "")
    ):
        return
    print(f"re-running with GLIBC_TUNABLES={ALLOCATOR_TUNABLES} (see benchmarks.overhead.ALLOCATOR_TUNABLES)")
    env = {**os.environ, "GLIBC_TUNABLES": ALLOCATOR_TUNABLES}
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.overhead", *sys.argv[1:]], env)


if __name__ == "__main__":
    reexec_with_allocator_settings()
    main()
