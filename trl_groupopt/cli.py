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

Before any model loads, the data is checked at the door (:func:`check_argv` for paths, :func:`load_datasets` for the
rows): an empty or missing file, a missing local model folder, unusable gold answers (counted; above
``--max_unusable_answer_fraction`` the run stops, below it warns) and plain-string prompts for a chat model (sent as
one user message, or kept with ``--string_prompts raw`` and a warning).

This module imports no TRL: `trl-groupopt --help`, `methods`, `train --help`, an unknown `--method`, and, once a
method's options are cached (`trl_groupopt.options`), `train --method NAME --help` and argument errors answer before
TRL is imported. The TRL parser, the trainer and the run live in `trl_groupopt.script`. From the console
(:func:`main`, :func:`command`) an error before training prints one line; a bare ``--debug`` or
``TRL_GROUPOPT_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import adapters, offline, options, resume, rewards
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
#: ``--dataset_format`` -> (prompt column, gold-answer column).
FORMAT_COLUMNS = {
    "prompt-answer": ("prompt", "solution"),
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
}
DATASET_FORMATS = tuple(FORMAT_COLUMNS)
#: What gsm8k and math answers must hold for the accuracy reward to score against them (the adapters' rule).
ANSWER_MARKERS = {"gsm8k": "a final '#### <answer>'", "math": "a \\boxed{<answer>}"}
#: One row of each ``--dataset_format``, as a line of a .jsonl file (the README and ``--help`` show them).
EXAMPLE_ROWS = {
    "prompt-answer": {"prompt": "Compute 13+14-2", "solution": "25"},
    "gsm8k": {
        "question": "Ann has 13 pens, buys 14 and gives 2 away. How many are left?",
        "answer": "13+14-2=25\n#### 25",
    },
    "math": {"problem": "Compute $13+14-2$.", "solution": "$13+14-2=\\boxed{25}$"},
}
#: ``--string_prompts``: what happens to plain-string prompts for a model whose tokenizer has a chat template.
STRING_PROMPTS = ("user_message", "raw")
LOCAL_DATA_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
#: The prompts :func:`prepare_prompts` looks at for the tokenizer's special tokens (already templated text).
_TEMPLATED_SAMPLE = 100


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


def layered_defaults(method: str, model_name_or_path: str | None, *, use_cpu: Any, bf16: Any) -> dict[str, Any]:
    """The defaults layers 3-5 (module docstring) give the training parser for a run of `method` on
    `model_name_or_path`; `use_cpu` and `bf16` are the device's (the help shows how they are chosen instead)."""
    defaults = {
        **get_method(method).config_defaults,  # a mode's settings (GRPO-fix); everything above still wins
        **RUN_DEFAULTS,
        "output_dir": default_output_dir(method, model_name_or_path),
        "use_cpu": use_cpu,
        "bf16": bf16,
    }
    if uses_embedded_policy(model_name_or_path):
        defaults.update(EMBEDDED_POLICY_DEFAULTS, model_name_or_path=offline.EMBEDDED_POLICY_PATH)
        defaults.update(EMBEDDED_POLICY_METHOD_DEFAULTS.get(method, {}))
    return defaults


# ---------------------------------------------------------------------------------------------------- parsing
def _script_description() -> str:
    """The script group's heading: one data row per --dataset_format, and how errors print."""
    width = max(len(f) for f in EXAMPLE_ROWS)
    rows = "\n".join(f"    {f:<{width}}  {json.dumps(row)}" for f, row in EXAMPLE_ROWS.items())
    return (
        f"  Your data: --dataset_name FILE --dataset_format FORMAT, one row per line of a .jsonl file:\n{rows}\n"
        '  A prompt may also be a list of chat messages: [{"role": "user", "content": "Compute 13+14-2"}].\n'
        "  Errors print one line; a bare --debug (or TRL_GROUPOPT_DEBUG=1) prints the traceback."
    )


def _add_config_option(group) -> None:
    group.add_argument(
        "--config",
        metavar="YAML",
        help="a YAML file of option: value pairs (and `env:` variables to set); the command line overrides it",
    )


def _read_config_file(argv: Sequence[str], prog: str) -> dict[str, Any]:
    """The mapping of ``--config PATH`` ({} without one), checked before TRL is imported (TRL's parser reads it
    again)."""
    config_arg = argparse.ArgumentParser(add_help=False)
    config_arg.add_argument("--config")
    path = config_arg.parse_known_args(argv)[0].config
    if path is None:
        return {}
    if not os.path.isfile(path):
        options.die(prog, f"--config {path}: no such file.")
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.safe_load(handle)
    except yaml.YAMLError as err:
        options.die(prog, f"--config {path} is not valid YAML: {err}")
    if not isinstance(content, dict):
        options.die(prog, f"--config {path} must hold a mapping of option: value, got {type(content).__name__}.")
    return content


def check_argv(method: str, argv: Sequence[str], prog: str) -> set[str]:
    """Answer ``--help`` and reject what argparse can before TRL is imported: a missing or malformed ``--config``
    file, an unknown option (in argv or the file), a bad choice or value, an unknown reward function, a local model
    folder or data file that does not exist, an empty data file. Help and argument errors exit; a path error
    raises. Returns the options argv sets, on the command line (abbreviated or not) or in its ``--config`` file."""
    config = _read_config_file(argv, prog)
    model = _given_value(argv, "model_name_or_path", config)
    if not {"-h", "--help"} & set(argv):  # before the options are read: fast even when they are not cached yet
        check_model_path(model)
        check_data_path(_given_value(argv, "dataset_name", config))
    described = options.method_options(method)
    parser = options.help_parser(
        method,
        described,
        prog=prog,
        defaults=layered_defaults(
            method, model, use_cpu="True unless an accelerator is visible", bf16="True on an accelerator with bf16"
        ),
        script_options=_add_config_option,
        script_description=_script_description(),
    )
    parsed = options.parse_unset(parser, argv)
    dests = [o["dest"] for o in described]
    unknown = sorted(set(config) - {"env"} - set(dests))
    if unknown:
        options.die(prog, f"--config {parsed.config}: " + options.unknown_option_message(unknown, dests, "key"))
    given = {**config, **{k: v for k, v in vars(parsed).items() if v is not None}}  # abbreviated flags too
    reward_funcs = given.get("reward_funcs") or []
    unknown = sorted(set([reward_funcs] if isinstance(reward_funcs, str) else reward_funcs) - set(REWARD_FUNCS))
    if unknown:
        options.die(prog, f"--reward_funcs: unknown {unknown}; choose from {sorted(REWARD_FUNCS)}.")
    check_model_path(given.get("model_name_or_path"))
    check_data_path(given.get("dataset_name"))
    return set(given) - {"config"}


def _given_value(argv: Sequence[str], dest: str, config: Mapping[str, Any]) -> Any:
    """`--dest VALUE` (or `--dest=VALUE`, hyphens or underscores) from argv, else from the config file: what the help
    and the path checks need before argv is parsed."""
    flags = {f"--{dest}", f"--{dest.replace('_', '-')}"}
    value = config.get(dest)
    for i, arg in enumerate(argv):
        name, sep, inline = arg.partition("=")
        if name in flags:
            value = inline if sep else (argv[i + 1] if i + 1 < len(argv) else value)
    return value


def parse(method: str, argv: Sequence[str] | None = None, *, prog: str | None = None):
    """(script_args, training_args, model_args, demo) for `method` from argv (default: sys.argv[1:]).

    ``--help`` and argument errors answer before TRL is imported (:func:`check_argv`); `prog` names the program in
    them (default: this script's file name). ``demo`` is True when the run trains the embedded policy on the
    synthetic task."""
    get_method(method)  # an unknown name fails here, before TRL is imported
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or os.path.basename(sys.argv[0])
    given = check_argv(method, argv, prog)
    from .script import build_parser

    parser = build_parser(method, argv, prog, given=given)
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if not hasattr(training_args, "max_all_none_reward_batches"):  # TRL's GRPOConfig (--method grpo): the CLI stops
        from .checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES  # on no reward, as documented (TRL is loaded by now)

        training_args.max_all_none_reward_batches = DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
    demo = uses_embedded_policy(model_args.model_name_or_path) and script_args.dataset_name is None
    return script_args, training_args, model_args, demo


# ---------------------------------------------------------------------------------------------------- data
def _looks_local(name: str) -> bool:
    """A path rather than a Hub id: absolute, ``./``, ``../`` or ``~``, or inside a folder that exists here."""
    if os.path.isabs(name) or name in (".", "..") or name.startswith(("./", "../", ".\\", "..\\", "~")):
        return True
    parent = os.path.dirname(os.path.normpath(name))
    return bool(parent) and os.path.isdir(parent)


def check_model_path(name: str | None) -> None:
    """A ``--model_name_or_path`` that looks local (:func:`_looks_local`) must be a folder that exists."""
    if name is None or not _looks_local(name) or os.path.isdir(os.path.expanduser(name)):
        return
    what = "is a file, not a model folder" if os.path.exists(os.path.expanduser(name)) else "no such folder"
    raise FileNotFoundError(
        f"--model_name_or_path {name}: {what}. Give the folder of a saved model (the one holding config.json) or a "
        "Hub model id such as Qwen/Qwen2.5-0.5B-Instruct."
    )


def check_data_path(name: str | None) -> None:
    """A ``--dataset_name`` that names a local file exists, has a supported extension and is not empty."""
    if name is None:
        return
    if os.path.isfile(name):
        if not any(name.lower().endswith(e) for e in LOCAL_DATA_BUILDERS):
            raise ValueError(
                f"--dataset_name {name!r} is a file with an unsupported extension; use one of "
                f"{sorted(LOCAL_DATA_BUILDERS)} (or a folder, or a Hub dataset name)."
            )
        if _is_blank(name):
            row = json.dumps(EXAMPLE_ROWS["prompt-answer"])
            raise ValueError(
                f"--dataset_name {name} is empty: there is nothing to train on. Give one row per line, e.g. {row}"
            )
    elif not os.path.isdir(name) and (_looks_local(name) or name.lower().endswith(tuple(LOCAL_DATA_BUILDERS))):
        raise FileNotFoundError(f"--dataset_name {name!r}: no such file or folder.")


def _is_blank(path: str, chunk: int = 1 << 16) -> bool:
    """Whether the file holds nothing but whitespace (read until the first other byte)."""
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            if block.strip():
                return False
    return True


def load_raw_dataset(name: str, config: str | None = None, split: str = "train"):
    """One split of a Hub dataset, a local data file (.jsonl .json .parquet .csv) or a local folder.

    A folder written by ``Dataset.save_to_disk`` loads with ``load_from_disk``; any other folder is read by
    ``datasets.load_dataset`` (data files inside). Errors name the accepted forms, and the file."""
    import datasets

    check_data_path(name)
    if os.path.isfile(name):
        builder = next(b for e, b in LOCAL_DATA_BUILDERS.items() if name.lower().endswith(e))
        try:
            return datasets.load_dataset(builder, data_files=name, split="train")
        except Exception as err:  # datasets' own errors name neither the file nor the fix
            raise ValueError(f"--dataset_name {name}: no rows could be read as {builder} ({err}).") from err
    if os.path.isdir(name):
        if os.path.exists(os.path.join(name, "dataset_info.json")) or os.path.exists(
            os.path.join(name, "dataset_dict.json")
        ):
            loaded = datasets.load_from_disk(name)
            return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        return datasets.load_dataset(name, config, split=split)
    return datasets.load_dataset(name, config, split=split)


def to_prompt_solution(dataset, dataset_format: str):
    """``dataset`` in TRL's prompt format with a ``solution`` column, read as ``dataset_format`` says; the error
    names the columns found and the option to change."""
    columns = dataset.column_names
    need = FORMAT_COLUMNS[dataset_format]
    missing = [c for c in need if c not in columns]
    if missing:
        others = [f for f in DATASET_FORMATS if f != dataset_format and all(c in columns for c in FORMAT_COLUMNS[f])]
        hint = f" It looks like --dataset_format {others[0]}." if others else ""
        raise ValueError(
            f"--dataset_format {dataset_format} needs the columns {list(need)}, but the dataset has "
            f"{columns} (missing {missing}).{hint} Formats: 'prompt-answer' (prompt, solution), 'gsm8k' "
            "(question, answer), 'math' (problem, solution); or rename your columns."
        )
    if dataset_format == "prompt-answer":
        return dataset
    adapter = adapters.gsm8k_to_conversational if dataset_format == "gsm8k" else adapters.math_to_conversational
    return dataset.map(adapter, remove_columns=columns)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def check_answers(raw, converted, dataset_format: str, name: str, max_fraction: float) -> None:
    """Count the rows whose gold answer the accuracy reward cannot use: empty or null in the raw answer column, or
    (gsm8k, math) without the marker the adapter reads. More than `max_fraction` of the rows raises; fewer warns."""
    column = FORMAT_COLUMNS[dataset_format][1]
    empty = [i for i, answer in enumerate(raw[column]) if _blank(answer)]
    unusable = [i for i, solution in enumerate(converted["solution"]) if _blank(solution)]
    if not unusable:
        return
    fraction = len(unusable) / len(converted)
    unmarked = sorted(set(unusable) - set(empty))
    parts = [f"{len(empty)} empty or null"] if empty else []
    if unmarked:
        first = str(raw[unmarked[0]][column])
        parts.append(
            f"{len(unmarked)} without {ANSWER_MARKERS[dataset_format]} (e.g. row {unmarked[0]}: {first[-60:]!r})"
        )
    message = (
        f"--dataset_name {name}: {len(unusable)} of {len(converted)} rows ({fraction:.1%}) have no usable answer in "
        f"{column!r} ({', '.join(parts)}); they get no reward."
    )
    fix = "fix those rows or drop them"
    if dataset_format != "prompt-answer":
        fix += ", or choose the --dataset_format that matches the data"
    if fraction > max_fraction:
        raise ValueError(
            f"{message} That is more than --max_unusable_answer_fraction {max_fraction}: {fix} (or raise "
            "--max_unusable_answer_fraction)."
        )
    warnings.warn(f"{message} Training goes on without them; to use them, {fix}.", UserWarning, stacklevel=2)


def prepare_prompts(dataset, name: str, model_args, *, mode: str = "user_message", trust_remote_code: bool = False):
    """``dataset`` with plain-string prompts sent as one user message each when the model's tokenizer has a chat
    template (`mode` ``"user_message"``; ``"raw"`` keeps them and warns). Without a template, with conversational
    prompts, or with prompts that already hold the tokenizer's special tokens, ``dataset`` is returned as is. Loads
    the tokenizer only (not the model), and only for string prompts."""
    sample = dataset[:_TEMPLATED_SAMPLE]["prompt"]
    if not sample or not isinstance(sample[0], str):
        return dataset
    from transformers import AutoTokenizer

    model = model_args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(
        model, revision=model_args.model_revision, trust_remote_code=trust_remote_code
    )
    special = [t for t in tokenizer.all_special_tokens if t]
    if tokenizer.chat_template is None or any(t in p for p in sample for t in special):
        return dataset
    if mode == "raw":
        warnings.warn(
            f"--dataset_name {name}: 'prompt' holds plain strings and the tokenizer of {model} has a chat template, "
            "which they bypass: the model continues the raw text, which often earns no reward. Use "
            "--string_prompts user_message, or write prompts as [{'role': 'user', 'content': ...}].",
            UserWarning,
            stacklevel=2,
        )
        return dataset
    _note(
        f"--dataset_name {name}: the prompts are plain strings and the tokenizer has a chat template: each prompt is "
        "sent as one user message (--string_prompts raw keeps the text as is)."
    )
    return dataset.map(adapters.string_prompt_to_conversational)


def _note(text: str) -> None:
    if os.environ.get("RANK", "0") == "0":  # one line per run, not per process
        print(f"[trl-groupopt] {text}", flush=True)


def load_datasets(script_args: DemoScriptArguments, model_args=None, *, trust_remote_code: bool = False):
    """(train, held-out) datasets: the synthetic task's splits, or ``--dataset_name`` read as ``--dataset_format``
    (held-out None), checked at the door: rows, answers (:func:`check_answers`) and prompts
    (:func:`prepare_prompts`, which needs `model_args`)."""
    if script_args.dataset_name is None:
        train = offline.make_arithmetic_dataset(script_args.num_train_examples, seed=0, split="train")
        test = offline.make_arithmetic_dataset(script_args.num_eval_examples, seed=0, split="test")
        return train, test
    name = script_args.dataset_name
    raw = load_raw_dataset(name, script_args.dataset_config, script_args.dataset_train_split)
    if len(raw) == 0:
        raise ValueError(f"--dataset_name {name} has no rows in split {script_args.dataset_train_split!r}.")
    data = to_prompt_solution(raw, script_args.dataset_format)
    check_answers(raw, data, script_args.dataset_format, name, script_args.max_unusable_answer_fraction)
    if model_args is not None:
        mode = script_args.string_prompts
        data = prepare_prompts(data, name, model_args, mode=mode, trust_remote_code=trust_remote_code)
    return data, None


# ---------------------------------------------------------------------------------------------------- training
def _quiet_known_warnings() -> None:
    # TRL 1.16 reads `model.is_gradient_checkpointing` (deprecated in transformers 5) at every generation; the
    # warning names nothing the user can change.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def prepare_output_dir(
    output_dir: str, resume_from_checkpoint: str | None, overwrite: bool, main: bool = True, method=None, args=None
):
    """The checkpoint to resume from (None: a fresh run), after the resume rules of `trl_groupopt.resume` (a fresh
    run over an earlier run, another method's checkpoint, a finished run: printed, exit 0). ``"last"``: the newest
    complete checkpoint of `output_dir`. ``overwrite`` (a fresh run only) deletes the earlier checkpoints first (on
    the main process)."""
    if resume_from_checkpoint is not None and overwrite:
        raise ValueError(
            "--overwrite_output_dir starts a fresh run; it cannot be combined with --resume_from_checkpoint."
        )
    if resume_from_checkpoint is not None:
        checkpoint = resolve_resume(output_dir, resume_from_checkpoint)
        if method is not None and args is not None:  # the trainer checks again, and warns on changed settings
            resume.check_resume(checkpoint, method, args, warn=False)
            if (finished := resume.finished_message(checkpoint, args)) is not None:
                print(finished, flush=True)
                raise SystemExit(0)
        return checkpoint
    resume.refuse_fresh_run(output_dir, overwrite, cli=True)
    if overwrite and main:
        for folder in checkpoints(output_dir):
            shutil.rmtree(folder)
    return None


def _is_main_process() -> bool:
    """Rank 0 of a launched run (torchrun/accelerate set RANK), or a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def train(method: str, argv: Sequence[str] | None = None, *, prog: str | None = None) -> GroupOptTrainer:
    """Parse argv, check the data, train `method`, save the model, card, state and results; returns the trainer.

    The data is read and checked before the output folder is touched. The run then holds its output folder; a failed
    run leaves no empty output folder behind (`RunLock`; a half-written one is kept for inspection). Errors raise
    (the console entry points :func:`main` and :func:`command` print them as one line)."""
    _quiet_known_warnings()
    script_args, training_args, model_args, demo = parse(method, argv, prog=prog)
    train_dataset, eval_dataset = load_datasets(
        script_args, model_args, trust_remote_code=training_args.trust_remote_code
    )
    with RunLock(training_args.output_dir, enabled=_is_main_process()):
        training_args.resume_from_checkpoint = prepare_output_dir(
            training_args.output_dir,
            training_args.resume_from_checkpoint,
            script_args.overwrite_output_dir,
            main=_is_main_process(),
            method=method,
            args=training_args,
        )
        training_args.overwrite_output_dir = script_args.overwrite_output_dir  # the trainer's check reads it
        from .script import run

        return run(method, script_args, training_args, model_args, demo, train_dataset, eval_dataset)


# ---------------------------------------------------------------------------------------------------- console entry
DEBUG_ENVIRONMENT_VARIABLE = "TRL_GROUPOPT_DEBUG"


def take_debug_flag(argv: Sequence[str]) -> tuple[list[str], bool]:
    """(argv without a bare ``--debug``, whether the traceback is wanted: bare ``--debug`` or
    ``TRL_GROUPOPT_DEBUG=1``). ``--debug VALUE...`` stays: it is transformers' `TrainingArguments.debug`."""
    rest, debug = [], os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "").lower() in ("1", "true", "yes")
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            debug = True
        else:
            rest.append(arg)
    return rest, debug


def _raised_while_training(error: BaseException) -> bool:
    """Whether `error` came from inside `Trainer.train` (a failure mid-run keeps its traceback)."""
    trainer_module = sys.modules.get("transformers.trainer")
    if trainer_module is None:
        return False
    code = inspect.unwrap(trainer_module.Trainer.train).__code__
    frame = error.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code is code:
            return True
        frame = frame.tb_next
    return False


@contextlib.contextmanager
def one_line_errors(prog: str, debug: bool):
    """An error before training starts prints ``prog: error: message`` and exits 1; with `debug`, and for errors
    raised while training, the traceback as usual."""
    try:
        yield
    except Exception as error:
        if debug or _raised_while_training(error):
            raise
        text = str(error) if isinstance(error, ValueError | OSError) else f"{type(error).__name__}: {error}"
        options.die(prog, f"{text} (--debug shows the traceback)", status=1)


def command(method: str) -> None:
    """The example scripts' entry point: train `method` with `sys.argv`, errors as :func:`one_line_errors`."""
    argv, debug = take_debug_flag(sys.argv[1:])
    prog = os.path.basename(sys.argv[0])
    with one_line_errors(prog, debug):
        train(method, argv, prog=prog)


def _methods_table() -> str:
    width = max(len(name) for name in METHODS)
    return "\n".join(
        f"  {name:<{width}}  {spec.trainer_name}: {spec.summary or spec.paper}" for name, spec in METHODS.items()
    )


def main(argv: Sequence[str] | None = None) -> None:
    """`trl-groupopt train --method NAME [options]`, `trl-groupopt methods`; `--help` at every level."""
    argv, debug = take_debug_flag(sys.argv[1:] if argv is None else argv)
    epilog = (
        f"methods:\n{_methods_table()}\n\n"
        "examples:\n"
        "  trl-groupopt train --method echo                 # offline CPU demo (embedded policy)\n"
        "  trl-groupopt train --method otb --help           # every option of a method\n"
        "  trl-groupopt train --method dfpo --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\\n"
        "      --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k"
    )
    parser = options.OneLineParser(
        prog="trl-groupopt",
        description="Group RL objectives as drop-in TRL GRPOTrainer subclasses.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="{train,methods}", parser_class=options.OneLineParser)
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
        prog = f"trl-groupopt train --method {known.method}"
        with one_line_errors(prog, debug):
            train(known.method, rest, prog=prog)
    else:
        parser.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
