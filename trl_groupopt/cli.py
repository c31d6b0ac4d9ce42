"""The training script behind `examples/train_<method>.py` and the `trl-groupopt train` command.

TRL's example-script conventions: `TrlParser((ScriptArguments, <Method>Config, ModelConfig))`, so `--config x.yaml`
and every `GRPOConfig` flag (`--use_vllm --vllm_mode colocate`, `--use_peft --lora_r ...`, `--push_to_hub`) work
unchanged. With no `--model_name_or_path`, it trains the embedded tiny policy on the synthetic arithmetic task,
offline, with CPU-friendly defaults (fp32, no gradient checkpointing, lr 1e-4) and
an off-policy schedule (`steps_per_generation` > `gradient_accumulation_steps`) so the clipping methods act.
Precedence: command line > `--config` YAML > demo defaults > the config class's defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from . import adapters, offline, rewards, trainers  # noqa: F401  (importing trainers registers the methods)
from .registry import METHODS, get_method
from .trainers.base import GroupOptTrainer

#: Defaults for the embedded-policy demo (no model given): fast on a 2-core CPU, off-policy.
DEMO_DEFAULTS = dict(
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    per_device_train_batch_size=16,  # 4 prompts x 4 completions: whole groups per micro-batch
    num_generations=4,
    gradient_accumulation_steps=2,
    steps_per_generation=4,  # > gradient_accumulation_steps: off-policy, so the ratios differ from 1
    max_completion_length=48,
    temperature=1.0,
    beta=0.0,
    max_steps=60,
    logging_steps=5,
    save_strategy="no",
    report_to="none",
    bf16=False,
    gradient_checkpointing=False,
    seed=42,
    disable_tqdm=True,
)


@dataclass
class DemoScriptArguments(ScriptArguments):
    """TRL's `ScriptArguments` plus the synthetic task's size and the before/after evaluation."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset (e.g. openai/gsm8k, config main). Unset: the offline synthetic arithmetic task."},
    )
    num_train_examples: int = field(default=2000, metadata={"help": "Synthetic task: training prompts."})
    num_eval_examples: int = field(default=200, metadata={"help": "Synthetic task: held-out prompts for accuracy."})
    evaluate_accuracy: bool = field(
        default=True, metadata={"help": "Demo only: print held-out greedy accuracy before and after training."}
    )


def _model_given(argv: Sequence[str]) -> bool:
    """Whether argv (or its --config YAML) names a model. Parses ModelConfig alone: building the training config
    here would already validate CPU/GPU settings that the demo defaults are about to change."""
    model_args, *_ = TrlParser((ModelConfig,)).parse_args_and_config(list(argv), return_remaining_strings=True)
    return model_args.model_name_or_path is not None


def parse(method: str, argv: Sequence[str] | None = None):
    """(script_args, training_args, model_args, demo) for `method` from argv (default: sys.argv[1:])."""
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = get_method(method)
    parser_types = (DemoScriptArguments, spec.config_class, ModelConfig)
    demo = not _model_given(argv)
    parser = TrlParser(parser_types)
    parser.set_defaults(**spec.config_defaults)  # a mode's settings (GRPO-fix); the command line still wins
    if demo:
        parser.set_defaults(
            **DEMO_DEFAULTS,
            model_name_or_path=offline.EMBEDDED_POLICY_PATH,
            output_dir=os.path.join("outputs", f"{method}-demo"),
            use_cpu=not torch.cuda.is_available(),
        )
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    return script_args, training_args, model_args, demo


def load_datasets(script_args: DemoScriptArguments, demo: bool):
    """(train, eval) conversational prompt datasets with a `solution` column."""
    if script_args.dataset_name is None:
        train = offline.make_arithmetic_dataset(script_args.num_train_examples, seed=0, split="train")
        test = offline.make_arithmetic_dataset(script_args.num_eval_examples, seed=0, split="test")
        return train, test
    from datasets import load_dataset

    dataset = load_dataset(script_args.dataset_name, script_args.dataset_config)
    name = script_args.dataset_name.lower()
    adapter = adapters.gsm8k_to_conversational if "gsm8k" in name else adapters.math_to_conversational
    train = dataset[script_args.dataset_train_split]
    if "prompt" not in train.column_names or "solution" not in train.column_names:
        train = train.map(adapter, remove_columns=train.column_names)
    return train, None


def train(method: str, argv: Sequence[str] | None = None) -> GroupOptTrainer:
    script_args, training_args, model_args, demo = parse(method, argv)
    trainer_cls = get_method(method).trainer_class
    if training_args.use_cpu:
        torch.set_num_threads(1)  # on small CPUs one thread is much faster than torch's default

    # As TRL's grpo.py: model kwargs from ModelConfig (trust_remote_code lives on the training config, default False).
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    train_dataset, eval_dataset = load_datasets(script_args, demo)
    trainer = trainer_cls(
        model=model_args.model_name_or_path,
        reward_funcs=[rewards.accuracy_reward, rewards.format_reward],
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
    )
    evaluate = demo and script_args.evaluate_accuracy and eval_dataset is not None
    if evaluate:
        before = offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_dataset)["accuracy"]
    trainer.train()
    if evaluate:
        after = offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_dataset)["accuracy"]
        if trainer.accelerator.is_main_process:
            print(f"[{method}] held-out greedy accuracy ({len(eval_dataset)} prompts): {before:.1%} -> {after:.1%}")
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name or "synthetic-arithmetic")
    return trainer


def main(argv: Sequence[str] | None = None) -> None:
    """`trl-groupopt train --method echo [GRPOConfig / ModelConfig flags...]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="trl-groupopt", add_help=False)
    parser.add_argument("command", choices=["train"])
    parser.add_argument("--method", choices=sorted(METHODS), required=True)
    known, rest = parser.parse_known_args(argv)
    train(known.method, rest)


if __name__ == "__main__":
    main()
