"""The TRL half of the training command (`trl_groupopt.cli`): the parser, the trainer and the run's outputs.

`trl_groupopt.cli` imports this module only once a method is chosen and its options are parsed, so `--help`, `methods`
and argument errors never import TRL. The default layers the parser applies are described in `trl_groupopt.cli`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from . import offline
from .cli import (
    DATASET_FORMATS,
    EMBEDDED_POLICY_DEFAULTS,
    EMBEDDED_POLICY_METHOD_DEFAULTS,
    REWARD_FUNCS,
    RUN_DEFAULTS,
    default_output_dir,
    load_datasets,
    uses_embedded_policy,
)
from .device import device_supports_bf16, has_accelerator
from .model_card import SYNTHETIC_DATASET_NAME
from .registry import get_method
from .reporting import HeldOutAccuracyCallback, ReadableProgressCallback, plot_reward_accuracy, write_results
from .trainers.base import GroupOptTrainer

__all__ = ["DemoScriptArguments", "build_parser", "run"]


@dataclass
class DemoScriptArguments(ScriptArguments):
    """TRL's `ScriptArguments` plus the data format, the reward functions and the demo's before/after evaluation."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub dataset (e.g. openai/gsm8k with --dataset_config main), a local file (.jsonl .json .parquet "
            ".csv) or a folder of them. Unset: the offline synthetic arithmetic task."
        },
    )
    dataset_format: str = field(
        default="prompt-answer",
        metadata={
            "help": "How to read --dataset_name: 'prompt-answer' (columns 'prompt', a string or a list of messages, and "
            "'solution', the gold answer), 'gsm8k' (question/answer with '#### 42') or 'math' (problem/solution with "
            "a final \\boxed{}). Never guessed from the name.",
            "choices": list(DATASET_FORMATS),
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy_reward"],
        metadata={
            "help": f"Reward functions from trl_groupopt.rewards, any of {sorted(REWARD_FUNCS)}. format_reward "
            "alone can be maximised by boxing any number, so the demo trains on accuracy only."
        },
    )
    num_train_examples: int = field(default=2000, metadata={"help": "Synthetic task: training prompts."})
    num_eval_examples: int = field(default=200, metadata={"help": "Synthetic task: held-out prompts for accuracy."})
    evaluate_accuracy: bool = field(
        default=True,
        metadata={
            "help": "Synthetic task: measure held-out greedy accuracy before and after training (results.json)."
        },
    )
    heldout_eval_steps: int = field(
        default=10,
        metadata={
            "help": "Synthetic task: also measure held-out greedy accuracy every this many optimizer steps, on the "
            "first --heldout_eval_examples held-out prompts (the plot's held-out curve); 0: only before and after."
        },
    )
    heldout_eval_examples: int = field(
        default=64, metadata={"help": "Synthetic task: held-out prompts of the accuracy measured while training."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a fresh run in an --output_dir that holds an earlier run's checkpoints: they are deleted "
            "first. Without it such a run refuses; --resume_from_checkpoint last resumes the earlier run instead."
        },
    )


def _preparse(argv: Sequence[str]) -> tuple[DemoScriptArguments, ModelConfig]:
    """The script and model arguments alone (from argv and its --config YAML), to choose the default layers before
    the training config is built (building it validates device settings those layers may change). `--help` is left
    for the full parser."""
    parser = TrlParser((DemoScriptArguments, ModelConfig), add_help=False)
    script_args, model_args, _ = parser.parse_args_and_config(list(argv), return_remaining_strings=True)
    return script_args, model_args


def _options_set(argv: Sequence[str]) -> set[str]:
    """The option names argv sets, on the command line or in its --config YAML file."""
    names = {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--")}
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config")
    path = config.parse_known_args(list(argv))[0].config
    if path and os.path.isfile(path):
        import yaml

        with open(path, encoding="utf-8") as handle:
            content = yaml.safe_load(handle)
        if isinstance(content, dict):
            names |= set(content)
    return names


def build_parser(method: str, argv: Sequence[str] = ()) -> TrlParser:
    """The method's full parser (script, method config and model arguments), its defaults layered as described in
    `trl_groupopt.cli` for what argv names."""
    spec = get_method(method)
    _, model_args = _preparse(argv)
    parser = TrlParser(
        (DemoScriptArguments, spec.config_class, ModelConfig),
        prog=f"trl-groupopt train --method {method}",
        description=f"Train with {spec.trainer_name} ({spec.paper}). {spec.summary}".strip(),
    )
    parser.set_defaults(**spec.config_defaults)  # a mode's settings (GRPO-fix); the command line still wins
    use_cpu = not has_accelerator()
    parser.set_defaults(
        **RUN_DEFAULTS,
        output_dir=default_output_dir(method, model_args.model_name_or_path),
        use_cpu=use_cpu,
        # the method configs pick bf16 by device themselves; TRL's GRPOConfig (the base trainer) would train in bf16
        # autocast on a CPU, several times slower than fp32
        bf16=device_supports_bf16(use_cpu),
    )
    if uses_embedded_policy(model_args.model_name_or_path):
        parser.set_defaults(**EMBEDDED_POLICY_DEFAULTS, model_name_or_path=offline.EMBEDDED_POLICY_PATH)
        parser.set_defaults(**EMBEDDED_POLICY_METHOD_DEFAULTS.get(method, {}))
    named = _options_set(argv)
    if "save_steps" in named and "save_strategy" not in named:
        parser.set_defaults(save_strategy="steps")  # --save_steps alone saves every that many steps
    return parser


def set_cpu_threads(training_args, embedded: bool) -> None:
    """One torch thread per process for the tiny policy (its matrices are too small to split: more threads only
    add synchronisation, ~30x slower on 2 cores); for larger models the cores divided among local processes."""
    if not training_args.use_cpu and torch.cuda.is_available():
        return
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = 1 if embedded else max(1, (os.cpu_count() or 1) // local_processes)
    torch.set_num_threads(threads)


def _build_trainer(method, script_args, training_args, model_args, train_dataset) -> GroupOptTrainer:
    """The method's trainer as TRL's grpo.py builds it (model kwargs from ModelConfig, `trust_remote_code` from the
    training config, default False), with the readable progress callback."""
    spec = get_method(method)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    trainer = spec.trainer_class(
        model=model_args.model_name_or_path,
        reward_funcs=[REWARD_FUNCS[name] for name in script_args.reward_funcs],
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.remove_callback(ProgressCallback)  # one of these two is installed, by disable_tqdm
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(ReadableProgressCallback(spec.headline_metric, show_bar=not training_args.disable_tqdm))
    return trainer


def _save_outputs(trainer, method, training_args, model_args, dataset_name, curve, wall_start, say) -> None:
    """The card, trainer state, plot and results.json beside the saved model (main process). The held-out accuracy
    is `trainer.heldout_accuracy` (None when not measured); `curve`: the callback measuring it while training, or
    None."""
    trainer.create_model_card(dataset_name=dataset_name)  # after save_model: replaces PEFT's template card
    trainer.save_state()
    heldout = trainer.heldout_accuracy or {}
    before, after = heldout.get("before", float("nan")), heldout.get("after", float("nan"))
    report = trainer.mechanism_report
    plot = plot_reward_accuracy(
        trainer.state.log_history,
        os.path.join(training_args.output_dir, "reward_accuracy.png"),
        heldout=[(0, before), (trainer.state.global_step, after)] if heldout else [],
        heldout_curve=curve.points if curve else [],
        heldout_label=f"accuracy (held-out, greedy, {heldout.get('num_examples')} prompts)",
        curve_label=f"accuracy (held-out, greedy, first {len(curve.dataset)} prompts)" if curve else "",
        mechanism_report=report,
        title=f"{method}: {os.path.basename(os.path.normpath(model_args.model_name_or_path))}",
    )
    if plot is None:
        say("matplotlib is not installed: no reward_accuracy.png (pip install matplotlib)")
    write_results(
        training_args.output_dir,
        method=method,
        accuracy_before=before,
        accuracy_after=after,
        heldout_examples=heldout.get("num_examples"),
        heldout_curve=[list(point) for point in curve.points] if curve else [],
        heldout_curve_examples=len(curve.dataset) if curve else None,
        mechanism=report.to_dict() if report is not None else None,
        steps=trainer.state.global_step,
        wall_seconds=round(time.perf_counter() - wall_start, 1),
        num_processes=trainer.accelerator.num_processes,
    )
    say(f"saved the model, README.md (card), trainer_state.json, results.json and plots in {training_args.output_dir}")


def run(method, script_args, training_args, model_args, demo) -> GroupOptTrainer:
    """Train `method` with parsed arguments; save the model, card, state and results; returns the trainer."""
    set_cpu_threads(training_args, uses_embedded_policy(model_args.model_name_or_path))
    start = time.perf_counter()
    train_dataset, eval_dataset = load_datasets(script_args, demo)
    trainer = _build_trainer(method, script_args, training_args, model_args, train_dataset)
    main = trainer.accelerator.is_main_process

    def say(text: str) -> None:
        if main:
            print(f"[{method}] {text}", flush=True)

    # one process measures; the others wait at training's first collective
    evaluate = demo and script_args.evaluate_accuracy and eval_dataset is not None and main
    curve = None
    if evaluate:
        say(f"held-out greedy accuracy before training ({len(eval_dataset)} prompts)...")
        before = offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_dataset)["accuracy"]
        say(f"  {before:.1%}")
        if script_args.heldout_eval_steps > 0:
            subset = eval_dataset.select(range(min(script_args.heldout_eval_examples, len(eval_dataset))))
            curve = HeldOutAccuracyCallback(trainer, subset, script_args.heldout_eval_steps)
            trainer.add_callback(curve)
    say(
        f"training {training_args.max_steps if training_args.max_steps > 0 else ''} steps -> {training_args.output_dir}"
    )
    if training_args.resume_from_checkpoint is not None:
        say(f"resuming from {training_args.resume_from_checkpoint}")
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if evaluate:
        after = offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_dataset)["accuracy"]
        say(f"held-out greedy accuracy ({len(eval_dataset)} prompts): {before:.1%} -> {after:.1%}")
        trainer.heldout_accuracy = {"before": before, "after": after, "num_examples": len(eval_dataset)}
    # The card describes the synthetic task when no dataset was named (model_card.SYNTHETIC_DATASET_NAME).
    dataset_name = script_args.dataset_name or SYNTHETIC_DATASET_NAME
    trainer.save_model(training_args.output_dir)
    if main:
        _save_outputs(trainer, method, training_args, model_args, dataset_name, curve, start, say)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
    return trainer
