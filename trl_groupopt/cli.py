"""The training script behind `examples/train_<method>.py` and the `trl-groupopt train` command.

TRL's example-script conventions: `TrlParser((ScriptArguments, <Method>Config, ModelConfig))`, so `--config x.yaml`
and every `GRPOConfig` flag (`--use_vllm --vllm_mode colocate`, `--use_peft --lora_r ...`, `--push_to_hub`) work
unchanged, and `--help` lists them all with the method's own fields.

Defaults compose in layers (each layer only fills what the ones above left unset):

1. the command line, 2. the `--config` YAML file,
3. :data:`EMBEDDED_POLICY_DEFAULTS` (and :data:`EMBEDDED_POLICY_METHOD_DEFAULTS`): only with the embedded tiny policy (no `--model_name_or_path`): its learning
   rate, sampling temperature, completion length and run length,
4. :data:`RUN_DEFAULTS` for every run, named model or not: the off-policy schedule (`steps_per_generation` >
   `gradient_accumulation_steps`, so the clipping methods act), logging, CPU when there is no GPU,
5. the method's `config_defaults` from the registry (GRPO-fix), then the config class's own defaults (bf16 only
   where the device supports it).

With no model and no dataset it trains the embedded policy on the synthetic arithmetic task, offline, and leaves in
`outputs/<method>-demo`: the model, its card, `trainer_state.json`, `results.json` (held-out greedy accuracy before
and after), `reward_accuracy.png` and its last two checkpoints (one every 20 steps).

A run holds its output folder (`trl_groupopt.run_folder.RunLock`): a second run into it refuses. A fresh run into a
folder that holds checkpoints refuses too, naming the two ways on: `--resume_from_checkpoint last` (the newest
complete checkpoint) or a checkpoint's path, or `--overwrite_output_dir` (or another `--output_dir`). `--save_steps`
without `--save_strategy` saves every that many steps.

This module imports no TRL: `trl-groupopt --help`, `methods`, `train --help` and an unknown `--method` answer at once.
The parser, the trainer and the run live in `trl_groupopt.script`, imported once a method is chosen.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import adapters, offline, rewards
from .registry import METHODS, get_method
from .run_folder import RunLock, checkpoints, resolve_resume
from .trainers.schedule import off_policy_schedule

if TYPE_CHECKING:
    from .script import DemoScriptArguments
    from .trainers.base import GroupOptTrainer

#: Every run, whatever the model: an off-policy schedule sized for one small device, readable logs.
RUN_DEFAULTS = dict(
    per_device_train_batch_size=16,  # 4 prompts x 4 completions: whole groups per micro-batch
    num_generations=4,
    # 2 optimizer steps per rollout of 2 micro-batches each: off-policy, so the ratios differ from 1
    **off_policy_schedule(updates_per_rollout=2, gradient_accumulation_steps=2),
    beta=0.0,
    logging_steps=5,
    report_to="none",
    seed=42,
)

#: The embedded tiny policy on the synthetic task. Its greedy decoding boxes only about half of its answers (the asset's
#: README.md), so RL on the accuracy reward alone learns to box the answers it already computes right: measured
#: (seeded, one CPU thread) held-out greedy accuracy rises from 18.0% to 29.5-33% in 80 steps for ECHO, DFPO,
#: CTPO and GRPO-fix (OTB at its own lr below: 34.5%), in ~85-105 s of CPU time. Learning rates above ~2e-4 made this
#: 1 M-parameter policy worse. A checkpoint every 20 steps (on a generation boundary, so a resumed run is the
#: uninterrupted one), the last 2 kept.
EMBEDDED_POLICY_DEFAULTS = dict(
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    temperature=1.0,  # rollouts sample the unboxed answers too: the contrast the accuracy reward learns from
    max_completion_length=48,  # the task's completions need <= 46 tokens
    max_steps=80,
    save_strategy="steps",
    save_steps=20,
    save_total_limit=2,
    gradient_checkpointing=False,  # 1 M parameters: recomputation only costs time
    ddp_find_unused_parameters=False,  # every parameter is used: skip DDP's extra graph traversal (and its warning)
    logging_steps=2,
)

#: Per-method additions to :data:`EMBEDDED_POLICY_DEFAULTS`. OTB's advantages are raw rewards minus its token
#: baseline (no std normalisation): measured, lr 1e-4 left its held-out accuracy flat (18.0% -> 17.5%) and 2e-4 / 3e-4
#: collapsed it, while 5e-5 gave 18.0% -> 34.5%.
EMBEDDED_POLICY_METHOD_DEFAULTS: dict[str, dict] = {"otb": dict(learning_rate=5e-5)}

#: Everything the embedded-policy demo sets; the benchmarks start from it so their runs compare with the demo's (they
#: save no checkpoints).
DEMO_DEFAULTS = {
    **RUN_DEFAULTS,
    **EMBEDDED_POLICY_DEFAULTS,
    "bf16": False,
    "disable_tqdm": True,
    "save_strategy": "no",
}

#: The reward functions the script can use, by name (``--reward_funcs``).
REWARD_FUNCS = {"accuracy_reward": rewards.accuracy_reward, "format_reward": rewards.format_reward}
DATASET_FORMATS = ("prompt-answer", "gsm8k", "math")
LOCAL_DATA_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def uses_embedded_policy(model_name_or_path: str | None) -> bool:
    """Whether the run trains the shipped tiny policy (no model named, or its path named)."""
    if model_name_or_path is None:
        return True
    return os.path.realpath(model_name_or_path) == os.path.realpath(offline.EMBEDDED_POLICY_PATH)


def default_output_dir(method: str, model_name_or_path: str | None) -> str:
    """``outputs/<method>-demo`` for the embedded policy, else ``outputs/<method>-<model basename>``."""
    if uses_embedded_policy(model_name_or_path):
        return os.path.join("outputs", f"{method}-demo")
    return os.path.join("outputs", f"{method}-{os.path.basename(os.path.normpath(model_name_or_path))}")


def parse(method: str, argv: Sequence[str] | None = None):
    """(script_args, training_args, model_args, demo) for `method` from argv (default: sys.argv[1:]).

    ``demo`` is True when the run trains the embedded policy on the synthetic task."""
    get_method(method)  # an unknown name fails here, before TRL is imported
    from .script import build_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(method, argv)
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    unknown = sorted(set(script_args.reward_funcs) - set(REWARD_FUNCS))
    if unknown:
        parser.error(f"--reward_funcs: unknown {unknown}; choose from {sorted(REWARD_FUNCS)}.")
    if not hasattr(training_args, "max_all_none_reward_batches"):  # TRL's GRPOConfig (--method grpo): the CLI stops
        from .checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES  # on no reward, as documented (TRL is loaded by now)

        training_args.max_all_none_reward_batches = DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
    demo = uses_embedded_policy(model_args.model_name_or_path) and script_args.dataset_name is None
    return script_args, training_args, model_args, demo


# ---------------------------------------------------------------------------------------------------- data
def load_raw_dataset(name: str, config: str | None = None, split: str = "train"):
    """One split of a Hub dataset, a local data file (.jsonl .json .parquet .csv) or a local folder.

    A folder written by ``Dataset.save_to_disk`` loads with ``load_from_disk``; any other folder is read by
    ``datasets.load_dataset`` (data files inside). Errors name the accepted forms."""
    import datasets

    if os.path.isfile(name):
        ext = next((e for e in LOCAL_DATA_BUILDERS if name.lower().endswith(e)), None)
        if ext is None:
            raise ValueError(
                f"--dataset_name {name!r} is a file with an unsupported extension; use one of "
                f"{sorted(LOCAL_DATA_BUILDERS)} (or a folder, or a Hub dataset name)."
            )
        return datasets.load_dataset(LOCAL_DATA_BUILDERS[ext], data_files=name, split="train")
    if os.path.isdir(name):
        if os.path.exists(os.path.join(name, "dataset_info.json")) or os.path.exists(
            os.path.join(name, "dataset_dict.json")
        ):
            loaded = datasets.load_from_disk(name)
            return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        return datasets.load_dataset(name, config, split=split)
    if name.startswith((".", "/", "~")) or name.lower().endswith(tuple(LOCAL_DATA_BUILDERS)):
        raise FileNotFoundError(f"--dataset_name {name!r}: no such file or folder.")
    return datasets.load_dataset(name, config, split=split)


def to_prompt_solution(dataset, dataset_format: str):
    """``dataset`` in TRL's prompt format with a ``solution`` column, read as ``dataset_format`` says; the error
    names the columns found and the option to change."""
    columns = dataset.column_names
    need = {"prompt-answer": ("prompt", "solution"), "gsm8k": ("question", "answer"), "math": ("problem", "solution")}
    missing = [c for c in need[dataset_format] if c not in columns]
    if missing:
        others = [f for f in DATASET_FORMATS if f != dataset_format and all(c in columns for c in need[f])]
        hint = f" It looks like --dataset_format {others[0]}." if others else ""
        raise ValueError(
            f"--dataset_format {dataset_format} needs the columns {list(need[dataset_format])}, but the dataset has "
            f"{columns} (missing {missing}).{hint} Formats: 'prompt-answer' (prompt, solution), 'gsm8k' "
            "(question, answer), 'math' (problem, solution); or rename your columns."
        )
    if dataset_format == "prompt-answer":
        return dataset
    adapter = adapters.gsm8k_to_conversational if dataset_format == "gsm8k" else adapters.math_to_conversational
    return dataset.map(adapter, remove_columns=columns)


def load_datasets(script_args: DemoScriptArguments, demo: bool = True):
    """(train, held-out) datasets: the synthetic task's splits, or ``--dataset_name`` read as ``--dataset_format``
    (held-out None)."""
    if script_args.dataset_name is None:
        train = offline.make_arithmetic_dataset(script_args.num_train_examples, seed=0, split="train")
        test = offline.make_arithmetic_dataset(script_args.num_eval_examples, seed=0, split="test")
        return train, test
    raw = load_raw_dataset(script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split)
    return to_prompt_solution(raw, script_args.dataset_format), None


# ---------------------------------------------------------------------------------------------------- training
def _quiet_known_warnings() -> None:
    # TRL 1.16 reads `model.is_gradient_checkpointing` (deprecated in transformers 5) at every generation; the
    # warning names nothing the user can change.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def prepare_output_dir(output_dir: str, resume_from_checkpoint: str | None, overwrite: bool, main: bool = True):
    """The checkpoint to resume from (None: a fresh run), after refusing a fresh run that would overwrite an earlier
    run's checkpoints. ``"last"``: the newest complete checkpoint of `output_dir`. ``overwrite`` (a fresh run only)
    deletes the earlier checkpoints first (on the main process)."""
    if resume_from_checkpoint is not None and overwrite:
        raise ValueError(
            "--overwrite_output_dir starts a fresh run; it cannot be combined with --resume_from_checkpoint."
        )
    if resume_from_checkpoint is not None:
        return resolve_resume(output_dir, resume_from_checkpoint)
    earlier = checkpoints(output_dir)
    if earlier and overwrite:
        if main:
            for folder in earlier:
                shutil.rmtree(folder)
    elif earlier:
        names = ", ".join(p.name for p in earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        raise ValueError(
            f"--output_dir {output_dir} already holds checkpoints of an earlier run ({names}); a fresh run would "
            "overwrite them. Resume it with --resume_from_checkpoint last (or a checkpoint's path), or start anew "
            "with another --output_dir or with --overwrite_output_dir (which deletes those checkpoints)."
        )
    return None


def _is_main_process() -> bool:
    """Rank 0 of a launched run (torchrun/accelerate set RANK), or a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def train(method: str, argv: Sequence[str] | None = None) -> GroupOptTrainer:
    """Parse argv, train `method`, save the model, card, state and results; returns the trainer.

    The run holds its output folder; a failed run leaves no empty output folder behind (`RunLock`; a half-written
    one is kept for inspection)."""
    _quiet_known_warnings()
    script_args, training_args, model_args, demo = parse(method, argv)
    with RunLock(training_args.output_dir, enabled=_is_main_process()):
        training_args.resume_from_checkpoint = prepare_output_dir(
            training_args.output_dir,
            training_args.resume_from_checkpoint,
            script_args.overwrite_output_dir,
            main=_is_main_process(),
        )
        from .script import run

        return run(method, script_args, training_args, model_args, demo)


# ---------------------------------------------------------------------------------------------------- console entry
def _methods_table() -> str:
    width = max(len(name) for name in METHODS)
    return "\n".join(
        f"  {name:<{width}}  {spec.trainer_name}: {spec.summary or spec.paper}" for name, spec in METHODS.items()
    )


def _check_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """`--config PATH` names a YAML mapping: checked before TRL is imported (TRL's parser reads it later)."""
    config_arg = argparse.ArgumentParser(add_help=False)
    config_arg.add_argument("--config")
    path = config_arg.parse_known_args(argv)[0].config
    if path is None:
        return
    if not os.path.isfile(path):
        parser.error(f"--config {path}: no such file.")
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.safe_load(handle)
    except yaml.YAMLError as err:
        parser.error(f"--config {path} is not valid YAML: {err}")
    if not isinstance(content, dict):
        parser.error(f"--config {path} must hold a mapping of option: value, got {type(content).__name__}.")


def main(argv: Sequence[str] | None = None) -> None:
    """`trl-groupopt train --method NAME [options]`, `trl-groupopt methods`; `--help` at every level."""
    argv = list(sys.argv[1:] if argv is None else argv)
    epilog = (
        f"methods:\n{_methods_table()}\n\n"
        "examples:\n"
        "  trl-groupopt train --method echo                 # offline CPU demo (embedded policy)\n"
        "  trl-groupopt train --method otb --help           # every option of a method\n"
        "  trl-groupopt train --method dfpo --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\\n"
        "      --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k"
    )
    parser = argparse.ArgumentParser(
        prog="trl-groupopt",
        description="Group RL objectives as drop-in TRL GRPOTrainer subclasses.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="{train,methods}")
    train_parser = commands.add_parser(
        "train",
        add_help=False,
        help="train a method; `trl-groupopt train --method NAME --help` lists every option",
        epilog=f"methods:\n{_methods_table()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train_parser.add_argument("--method", choices=list(METHODS), help="the method to train (see below)")
    commands.add_parser("methods", help="list the registered methods")
    known, rest = parser.parse_known_args(argv)
    if known.command == "methods":
        print(_methods_table())
    elif known.command == "train":
        if known.method is None:
            if any(a in ("-h", "--help") for a in rest):
                train_parser.print_help()
                print(
                    "\nAdd --method NAME --help for the method's options, e.g. trl-groupopt train --method otb --help"
                )
                sys.exit(0)
            train_parser.error(f"--method is required; one of {', '.join(METHODS)}")
        _check_config_file(train_parser, rest)
        train(known.method, rest)
    else:
        parser.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
