"""Training-step time and peak memory of TRL's GRPOTrainer and each trl-groupopt trainer, same process, same run.

What is timed. Generation is identical across trainers (none of them touches it) and would dominate, so it is
replaced: each trainer's `_generate_single_turn` (the sampling call inside TRL's `_generate`) returns a fixed,
seeded batch of random completions (the same token ids for every trainer, a spread of lengths up to
`--completion-length`, a quarter truncated without EOS). Everything after sampling runs unchanged through TRL's and
our code: decoding, the reward function (a cheap deterministic one), advantages, our subclasses' scoring hooks
(group ids, raw rewards), the behaviour-policy forward for `old_per_token_logps` (the schedule is off-policy by
default, so OTB captures its energy there, as in real training), the group-preserving shuffle, and then the
optimizer steps through `Trainer.train()`: `_compute_loss`, backward, gradient clipping, AdamW.

One optimizer step = `--grad-accum` micro-batches. Each trainer runs `--warmup` steps, then `--steps` timed steps
(both rounded up to whole generation cycles); a callback synchronises the device and reads the clock at each
step's start and end, and a wrapper times `_generate_and_score_completions` (the scoring, once per generation
cycle). Reported per trainer:
- `time_ms`: median over the timed steps of the step time without scoring, plus the scoring time amortised per
  step (total scoring / timed steps): the cost of one optimizer step with generation removed;
- `train_time_ms` (the median without scoring) and `scoring_ms_per_step`, and their ratios;
- `peak_memory_bytes`: on CUDA `torch.cuda.max_memory_allocated()` over the timed steps (reset after warm-up); on
  CPU the process's peak resident set size over the timed steps (Linux `VmHWM`, reset by writing 5 to
  `/proc/self/clear_refs`; where that is not allowed, `ru_maxrss`, which never resets: then only the first trainer's
  number is its own). `memory_kind` in the JSON says which. On CPU the RSS is dominated by the Python process
  (libraries), so the memory ratio there says little.
- `activation_peak_bytes`: the peak minus the memory held at the start of the timed steps (model, optimizer
  state), a more sensitive view of the per-step extra memory.
With `--repeats R` the list of trainers runs R times in alternating order (ABBA), the steps of all repeats are
pooled, and the baseline's repeat-to-repeat spread is reported as the noise floor.

Default model (GPU): Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864,
vocab 151,936, tied embeddings) built from config with random weights, bf16, TRL's bf16 autocast; prompts of
`--prompt-length` tokens, completions up to `--completion-length` (512), 8 sequences per micro-batch, 2 micro-batches
per step. `--smoke`: a tiny Qwen2 (hidden 32, 2 layers, the task tokenizer's ~70-token vocab) on CPU, a few steps.

Usage:
    python benchmarks/overhead.py --smoke --output-dir /tmp/bench          # CPU, < 1 min
    python benchmarks/overhead.py                                         # GPU defaults
    python benchmarks/overhead.py --plot-from benchmarks/results/overhead.json   # re-draw the PNG only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# name -> (label, config class name, trainer class name, config overrides). "trl": trl.GRPOConfig/GRPOTrainer.
TRAINERS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "grpo": ("TRL GRPOTrainer", "trl.GRPOConfig", "trl.GRPOTrainer", {}),
    "groupopt_base": ("GroupOptTrainer (TRL objective)", "trl.GRPOConfig", "GroupOptTrainer", {}),
    "echo": ("ECHO", "ECHOConfig", "ECHOTrainer", {}),
    "dfpo_min_replace": ("DFPO min_replace", "DFPOConfig", "DFPOTrainer", {"dfpo_transform": "min_replace"}),
    "dfpo_orth_proj": ("DFPO orth_proj", "DFPOConfig", "DFPOTrainer", {"dfpo_transform": "orth_proj"}),
    "dfpo_orth_proj_qp": ("DFPO orth_proj_qp", "DFPOConfig", "DFPOTrainer", {"dfpo_transform": "orth_proj_qp"}),
    "grpo_fix": ("GRPO-fix", "DFPOConfig", "DFPOTrainer", {"dfpo_transform": "symmetric_clip"}),
    "ctpo": ("CTPO", "CTPOConfig", "CTPOTrainer", {}),
    "otb": ("OTB", "OTBConfig", "OTBTrainer", {}),
}
BASELINE = "grpo"
# (time ratio, memory ratio) targets against TRL's GRPOTrainer.
TARGETS: dict[str, tuple[float, float]] = {
    **{
        name: (1.02, 1.03)
        for name in ("echo", "dfpo_min_replace", "dfpo_orth_proj", "dfpo_orth_proj_qp", "grpo_fix", "ctpo")
    },  # fmt: skip
    "otb": (1.05, 1.05),
}

QWEN25_05B = dict(  # Qwen/Qwen2.5-0.5B config.json shapes
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip

FULL_DEFAULTS = dict(steps=20, warmup=4, repeats=2, completion_length=512, prompt_length=128, batch_size=8,
                     num_generations=4, grad_accum=2, steps_per_generation=4, model="qwen2.5-0.5b")  # fmt: skip
SMOKE_DEFAULTS = dict(steps=4, warmup=2, repeats=1, completion_length=24, prompt_length=16, batch_size=4,
                      num_generations=4, grad_accum=2, steps_per_generation=4, model="tiny")  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Training-step time and peak memory of TRL's GRPOTrainer vs each trl-groupopt trainer "
        "(generation replaced by fixed random completions; see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR, help="Where JSON and PNG go.")
    parser.add_argument("--smoke", action="store_true", help="Tiny Qwen2 on CPU, a few steps (< 1 min).")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--trainers", default=",".join(TRAINERS), help="Comma-separated subset of: " + ", ".join(TRAINERS)
    )
    parser.add_argument(
        "--steps",
        type=int,
        help=f"Timed optimizer steps (default {FULL_DEFAULTS['steps']}, smoke {SMOKE_DEFAULTS['steps']}).",
    )
    parser.add_argument(
        "--warmup", type=int, help=f"Untimed optimizer steps first (default {FULL_DEFAULTS['warmup']})."
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help=f"Runs of the whole trainer list, ABBA order (default {FULL_DEFAULTS['repeats']}, smoke 1).",
    )
    parser.add_argument(
        "--model", choices=["qwen2.5-0.5b", "tiny"], help="Model shapes (default qwen2.5-0.5b; smoke tiny)."
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="Override the model's vocabulary size (e.g. 151936 with --model tiny to test the big-vocabulary head cheaply).",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="Model weights: auto = bf16 on CUDA, fp32 on CPU.",
    )
    parser.add_argument(
        "--completion-length",
        type=int,
        help="max_completion_length; completions are random with lengths up to it (default 512).",
    )
    parser.add_argument("--prompt-length", type=int, help="Prompt length in tokens (default 128).")
    parser.add_argument(
        "--batch-size", type=int, help="per_device_train_batch_size: sequences per micro-batch (default 8)."
    )
    parser.add_argument("--num-generations", type=int, help="Group size G (default 4).")
    parser.add_argument("--grad-accum", type=int, help="Micro-batches per optimizer step (default 2).")
    parser.add_argument(
        "--steps-per-generation", type=int, help="Micro-batches per generation (default 4: 2x grad-accum, off-policy)."
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="TRL's default; off by default here, which makes the step shorter and any overhead more visible.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-affinity", help="Pin to these CPUs, e.g. 0-1 (Linux), when sharing the machine.")
    parser.add_argument("--max-minutes", type=float, help="Skip further repeats once the next would end past this.")
    parser.add_argument("--plot-from", type=Path, help="Only re-draw the PNG from an existing overhead.json.")
    args = parser.parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.smoke else FULL_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.smoke and args.device == "auto":
        args.device = "cpu"
    args.trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    unknown = [t for t in args.trainers if t not in TRAINERS]
    if unknown:
        parser.error(f"unknown trainer(s) {unknown}; choose from {list(TRAINERS)}")
    if BASELINE not in args.trainers:
        args.trainers.insert(0, BASELINE)  # every ratio is against TRL's GRPOTrainer
    if args.batch_size % args.num_generations:
        parser.error("--batch-size must be a multiple of --num-generations (DFPO and OTB need whole groups).")
    # Whole generation cycles: the scoring (once per cycle) is then amortised exactly.
    cycle = max(1, args.steps_per_generation // args.grad_accum)
    args.cycle_steps = cycle
    args.warmup = -(-max(args.warmup, 1) // cycle) * cycle
    args.steps = -(-max(args.steps, 1) // cycle) * cycle
    return args


# ------------------------------------------------------------------------------------------------ memory probes
def _vm_hwm_bytes() -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmHWM:\s+(\d+)\s+kB", text)
    return int(match.group(1)) * 1024 if match else None


class MemoryProbe:
    """Peak memory over a window: CUDA allocator peak, or the CPU process's peak RSS."""

    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            self.kind = "cuda_max_memory_allocated"
        elif _vm_hwm_bytes() is not None and self._clear_refs():
            self.kind = "cpu_peak_rss_vmhwm_reset"
        else:
            self.kind = "cpu_ru_maxrss_not_resettable"

    @staticmethod
    def _clear_refs() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    def current(self) -> int:
        if self.device == "cuda":
            import torch

            return torch.cuda.memory_allocated()
        text = Path("/proc/self/status").read_text() if os.path.exists("/proc/self/status") else ""
        match = re.search(r"VmRSS:\s+(\d+)\s+kB", text)
        return int(match.group(1)) * 1024 if match else 0

    def reset(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        elif self.kind == "cpu_peak_rss_vmhwm_reset":
            self._clear_refs()

    def peak(self) -> int:
        if self.device == "cuda":
            import torch

            return torch.cuda.max_memory_allocated()
        if self.kind == "cpu_peak_rss_vmhwm_reset":
            return _vm_hwm_bytes() or 0
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


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


def classes(config_name: str, trainer_name: str):
    import trl

    import trl_groupopt

    def resolve(name):
        return getattr(trl, name.split(".", 1)[1]) if name.startswith("trl.") else getattr(trl_groupopt, name)

    return resolve(config_name), resolve(trainer_name)


def run_trainer(name: str, args, device: str, dtype, tokenizer, dataset, probe: MemoryProbe, workdir: str) -> dict:
    """Build one trainer on a fresh copy of the model, train warmup + steps optimizer steps, return its timings."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    from trl_groupopt.cli import DEMO_DEFAULTS

    label, config_name, trainer_name, overrides = TRAINERS[name]
    config_cls, trainer_cls = classes(config_name, trainer_name)
    total_steps = args.warmup + args.steps
    config_kwargs = dict(
        # from the demo: constant schedule, no KL, sampling temperature, quiet trainer
        **{
            k: DEMO_DEFAULTS[k]
            for k in ("lr_scheduler_type", "beta", "temperature", "save_strategy", "report_to", "disable_tqdm")
        },  # fmt: skip
        output_dir=os.path.join(workdir, name),
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
    config_kwargs.update(overrides)
    config = config_cls(**config_kwargs)

    allocated_before = probe.current()
    model = build_model(args, tokenizer, device, dtype)
    trainer = trainer_cls(model=model, reward_funcs=synthetic_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer)  # fmt: skip
    trainer._generate_single_turn = make_fake_sampler(tokenizer, args.completion_length, args.seed)
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics dict: noise in this benchmark's output

    record: dict[str, Any] = {"step_s": [], "scoring_s": [], "static_bytes": None, "peak_bytes": None}
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

    class StepTimer(TrainerCallback):
        def on_step_begin(self, _args, state, control, **kwargs):
            common.synchronize(device)
            pending["scoring"] = 0.0
            pending["t0"] = time.perf_counter()

        def on_step_end(self, _args, state, control, **kwargs):
            common.synchronize(device)
            elapsed = time.perf_counter() - pending["t0"]
            if state.global_step > args.warmup:
                record["step_s"].append(elapsed)
                record["scoring_s"].append(pending["scoring"])
                record["peak_bytes"] = probe.peak()
            elif state.global_step == args.warmup:  # the timed window starts now
                gc.collect()
                record["static_bytes"] = probe.current()
                probe.reset()

    trainer.add_callback(StepTimer())
    trainer.train()
    old_per_token_logps = None
    if trainer._buffered_inputs:
        old_per_token_logps = trainer._buffered_inputs[0].get("old_per_token_logps")
    record.update(
        off_policy=old_per_token_logps is not None,
        otb_energy_from_behaviour_forward=bool(
            trainer._buffered_inputs and "old_per_token_energy" in trainer._buffered_inputs[0]
        ),
        num_parameters=sum(p.numel() for p in model.parameters()),
        allocated_before_build_bytes=allocated_before,
    )
    del trainer, model  # the scoring wrapper and the trainer form a cycle: gc.collect() below frees both
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return record


def summarise(records: dict[str, list[dict]], probe_kind: str) -> dict[str, dict]:
    """Pool the repeats of each trainer and compute the ratios to TRL's GRPOTrainer."""
    out: dict[str, dict] = {}
    for name, runs in records.items():
        step = [s for r in runs for s in r["step_s"]]
        scoring = [s for r in runs for s in r["scoring_s"]]
        train_only = [a - b for a, b in zip(step, scoring)]
        train_ms = 1e3 * common.median(train_only)
        scoring_ms = 1e3 * sum(scoring) / len(scoring)
        per_repeat = []
        for r in runs:
            t_only = [a - b for a, b in zip(r["step_s"], r["scoring_s"])]
            per_repeat.append(1e3 * (common.median(t_only) + sum(r["scoring_s"]) / len(r["scoring_s"])))
        peak = max(r["peak_bytes"] or 0 for r in runs)
        static = max(r["static_bytes"] or 0 for r in runs)
        out[name] = {
            "label": TRAINERS[name][0],
            "time_ms": train_ms + scoring_ms,
            "train_time_ms": train_ms,
            "scoring_ms_per_step": scoring_ms,
            "step_ms_mean_raw": 1e3 * sum(step) / len(step),
            "time_ms_per_repeat": per_repeat,
            "timed_steps": len(step),
            "peak_memory_bytes": peak,
            "static_memory_bytes": static,
            "activation_peak_bytes": peak - static,
            "memory_kind": probe_kind,
            "num_parameters": runs[0]["num_parameters"],
            "off_policy": runs[0]["off_policy"],
            "allocated_before_build_bytes": [r["allocated_before_build_bytes"] for r in runs],
        }
        if name == "otb":
            out[name]["otb_energy_from_behaviour_forward"] = runs[0]["otb_energy_from_behaviour_forward"]
    base = out[BASELINE]
    for name, entry in out.items():
        entry["time_ratio"] = entry["time_ms"] / base["time_ms"]
        entry["train_time_ratio"] = entry["train_time_ms"] / base["train_time_ms"]
        entry["scoring_ratio"] = (
            entry["scoring_ms_per_step"] / base["scoring_ms_per_step"] if base["scoring_ms_per_step"] else None
        )
        entry["memory_ratio"] = (
            entry["peak_memory_bytes"] / base["peak_memory_bytes"] if base["peak_memory_bytes"] else None
        )
        base_act = base["activation_peak_bytes"]
        entry["activation_memory_ratio"] = entry["activation_peak_bytes"] / base_act if base_act > 0 else None
        target = TARGETS.get(name)
        entry["target_time_ratio"], entry["target_memory_ratio"] = target if target else (None, None)
        if target:
            entry["meets_time_target"] = entry["time_ratio"] <= target[0]
            entry["meets_memory_target"] = entry["memory_ratio"] is not None and entry["memory_ratio"] <= target[1]
    return out


def print_results(results: dict[str, dict], smoke: bool) -> str:
    rows = []
    for name, e in results.items():
        tt, tm = e["target_time_ratio"], e["target_memory_ratio"]

        def verdict(ok):
            return "" if ok is None else ("ok" if ok else "OVER")

        rows.append([
            name, f"{e['time_ms']:.1f}", f"{e['time_ratio']:.3f}x", f"<={tt:.2f}x {verdict(e.get('meets_time_target'))}" if tt else "-",
            f"{e['train_time_ms']:.1f}", f"{e['train_time_ratio']:.3f}x", f"{e['scoring_ms_per_step']:.1f}",
            common.format_bytes(e["peak_memory_bytes"]),
            f"{e['memory_ratio']:.3f}x" if e["memory_ratio"] else "n/a",
            f"<={tm:.2f}x {verdict(e.get('meets_memory_target'))}" if tm else "-",
            f"{e['activation_memory_ratio']:.3f}x" if e["activation_memory_ratio"] else "n/a",
        ])  # fmt: skip
    print()
    text = common.print_table(
        ["trainer", "step ms", "x GRPO", "target", "train ms", "x GRPO", "scoring ms/step", "peak mem", "x GRPO",
         "target", "act. mem x GRPO"],
        rows,
    )  # fmt: skip
    if smoke:
        print("(smoke run: tiny model on CPU; the ratios and targets are not meaningful here)")
    return text


def plot(payload: dict, path: Path) -> Path | None:
    plt = common.pyplot()
    if plt is None:
        return None
    results = payload["results"]
    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.1 * len(names) + 4), 4.5))
    for ax, key, target_key, title in (
        (axes[0], "time_ratio", "target_time_ratio", "optimizer-step time / TRL GRPOTrainer"),
        (axes[1], "memory_ratio", "target_memory_ratio", f"peak memory / TRL GRPOTrainer ({results[names[0]]['memory_kind']})"),
    ):  # fmt: skip
        values = [results[n][key] or 0.0 for n in names]
        colors = ["tab:gray" if n == BASELINE else "tab:blue" for n in names]
        ax.bar(range(len(names)), values, color=colors)
        for i, n in enumerate(names):
            target = results[n].get(target_key)
            if target:
                ax.hlines(target, i - 0.4, i + 0.4, colors="tab:red", linestyles="--")
            ax.text(i, values[i], f"{values[i]:.3f}", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        lo = min(values + [1.0]) - 0.05
        hi = max(values + [1.05]) + 0.05
        ax.set_ylim(max(0.0, lo), hi)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
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
        out = plot(payload, args.output_dir / "overhead.png")
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
    tokenizer = build_tokenizer()
    generation_batch = args.batch_size * args.steps_per_generation
    num_prompts = generation_batch // args.num_generations * -(-(args.warmup + args.steps) // args.cycle_steps) + 8
    dataset = make_prompts(max(num_prompts, 64), args.prompt_length, args.seed)
    probe = MemoryProbe(device)
    print(f"device: {common.describe_device(device)['description']}; memory: {probe.kind}; trainers: {args.trainers}; "
          f"{args.warmup} warm-up + {args.steps} timed steps x {args.repeats} repeat(s)", flush=True)  # fmt: skip

    records: dict[str, list[dict]] = {name: [] for name in args.trainers}
    started = time.perf_counter()
    run_seconds: list[float] = []
    stopped_early = None
    with tempfile.TemporaryDirectory(prefix="overhead-") as workdir:
        for repeat in range(args.repeats):
            order = args.trainers if repeat % 2 == 0 else list(reversed(args.trainers))  # ABBA against drift
            for name in order:
                elapsed = time.perf_counter() - started
                expected = max(run_seconds) if run_seconds else 0.0
                if args.max_minutes and run_seconds and elapsed + expected > 60 * args.max_minutes:
                    stopped_early = f"stopped at repeat {repeat + 1} before {name}: --max-minutes {args.max_minutes}"
                    break
                t0 = time.perf_counter()
                record = run_trainer(name, args, device, dtype, tokenizer, dataset, probe, workdir)
                run_seconds.append(time.perf_counter() - t0)
                records[name].append(record)
                step_ms = 1e3 * common.median(record["step_s"])
                print(f"  [{repeat + 1}/{args.repeats}] {name:<18} median step {step_ms:8.1f} ms  "
                      f"peak {common.format_bytes(record['peak_bytes'])}  ({run_seconds[-1]:.1f} s)", flush=True)  # fmt: skip
                # Written after every trainer: a run cut short by a time limit still leaves its numbers.
                payload = build_payload(args, device, dtype, probe, records, started, stopped_early)
                common.write_json(args.output_dir / "overhead.json", payload)
            if stopped_early:
                print(stopped_early, flush=True)
                break

    payload = build_payload(args, device, dtype, probe, records, started, stopped_early)
    payload["table"] = print_results(payload["results"], args.smoke)
    if payload["baseline_repeat_spread"] is not None:
        print(f"noise floor: TRL GRPOTrainer's time varied by {payload['baseline_repeat_spread']:.1%} between repeats")
    json_path = common.write_json(args.output_dir / "overhead.json", payload)
    png_path = plot(payload, args.output_dir / "overhead.png")
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    return payload


def build_payload(args, device, dtype, probe, records, started, stopped_early) -> dict:
    done = {name: runs for name, runs in records.items() if runs}
    results = summarise(done, probe.kind)
    base_repeats = results[BASELINE]["time_ms_per_repeat"]
    noise = (max(base_repeats) - min(base_repeats)) / common.median(base_repeats) if len(base_repeats) > 1 else None
    return {
        "benchmark": "overhead",
        "device": common.describe_device(device),
        "command": common.command_line(),
        "smoke": args.smoke,
        "settings": {
            "model": args.model,
            "dtype": str(dtype).replace("torch.", ""),
            "vocab_size": args.vocab_size,
            "completion_length": args.completion_length,
            "prompt_length": args.prompt_length,
            "per_device_train_batch_size": args.batch_size,
            "num_generations": args.num_generations,
            "gradient_accumulation_steps": args.grad_accum,
            "steps_per_generation": args.steps_per_generation,
            "gradient_checkpointing": args.gradient_checkpointing,
            "warmup_steps": args.warmup,
            "timed_steps": args.steps,
            "repeats_requested": args.repeats,
            "repeats_done": {name: len(runs) for name, runs in records.items()},
            "seed": args.seed,
            "timed": "optimizer steps through Trainer.train() with generation replaced by fixed random completions; "
            "time_ms = median step time without scoring + scoring (behaviour forward, rewards, advantages) "
            "amortised per step",
        },  # fmt: skip
        "baseline": BASELINE,
        "baseline_repeat_spread": noise,
        "memory_kind": probe.kind,
        "stopped_early": stopped_early,
        "missing_trainers": [name for name, runs in records.items() if not runs],
        "wall_s": time.perf_counter() - started,
        "results": results,
        # the acceptance format: every trainer's name maps to its entry (time_ratio, memory_ratio, ...) at the top
        **results,
    }


if __name__ == "__main__":
    main()
