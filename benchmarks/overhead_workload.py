"""The overhead benchmark's trainers and workload: the variants timed (`variants`, each against TRL's GRPOTrainer,
`BASELINE`, and the A/A control, `CONTROL`), their targets, the seeded benchmark model, the prompts, the fixed random
completions that stand in for generation (`make_fake_sampler`) and the trainer built from them (`build_trainer`).
Used by `benchmarks.overhead` (benchmarks/README.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
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
