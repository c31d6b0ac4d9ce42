"""The TRL half of the training command (`trl_groupopt.cli`): :class:`MethodParser`, TRL's own parser for a method,
shaped by public argparse hooks only (docs/getting-started.md, "The command line: help and errors"), and the run."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import yaml
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser, get_peft_config

from ..data import adapters, offline, rewards
from ..data.offline import uses_embedded_policy
from ..methods.registry import get_method
from ..runfolder import stop
from ..runfolder.checkpoints import FINAL_RECORD, remove_record, write_final_record
from ..trainer import reporting
from ..trainer.args_check import option_problems
from ..trainer.card import SYNTHETIC_DATASET_NAME
from ..trainer.device import device_supports_bf16, has_accelerator
from ..trainer.report import MechanismReportCallback
from ..trainer.reporting import HeldOutAccuracyCallback, ReadableProgressCallback, RunHistoryCallback, plain_warnings
from ..trainer.schedule import schedule_text
from .defaults import EMBEDDED_POLICY_DEFAULTS, RUN_DEFAULTS

__all__ = ["Deferred", "DemoScriptArguments", "MethodParser", "run"]

#: The reward functions the command can use, by name (``--reward_funcs``).
REWARD_FUNCS = {"accuracy_reward": rewards.accuracy_reward, "format_reward": rewards.format_reward}


def _option(default: Any, help: str, **metadata: Any) -> Any:
    factory = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(**factory, metadata={"help": help, **metadata})


@dataclass
class DemoScriptArguments(ScriptArguments):
    """TRL's `ScriptArguments` plus the data format and checks, the reward functions and the demo's evaluation."""

    dataset_format: str = _option("prompt-answer", "How to read --dataset_name.", choices=adapters.DATASET_FORMATS)
    reward_funcs: list[str] = _option(
        ["accuracy_reward"], "From trl_groupopt.data.rewards.", choices=list(REWARD_FUNCS)
    )
    max_unusable_answer_fraction: float = _option(
        0.1, "Rows whose gold answer the reward cannot read: above this fraction the run stops, below it warns."
    )
    max_overlong_prompt_fraction: float = _option(
        0.1, "Prompts over the context minus --max_completion_length: above this fraction stop, below it warn."
    )
    string_prompts: str = _option(
        "user_message",
        "Plain-string prompts for a chat template: 'user_message' sends each as one user message, "
        "'raw' keeps the text (and warns).",
        choices=adapters.STRING_PROMPTS,
    )
    num_train_examples: int = _option(2000, "Synthetic task (no --dataset_name): training prompts.")
    num_eval_examples: int | None = _option(
        None,
        "Held-out prompts for greedy accuracy: the synthetic task's test split (default 200), or rows of "
        "--dataset_name carved off before training (default: a tenth of its rows, at most 200; none under 100 rows).",
    )
    evaluate_accuracy: bool = _option(True, "Held-out greedy accuracy before and after training.")
    heldout_eval_steps: int = _option(10, "Synthetic task: held-out accuracy every this many steps too; 0: never.")
    heldout_eval_examples: int = _option(64, "Synthetic task: prompts of that curve.")
    overwrite_output_dir: bool = _option(False, "A fresh run deletes the checkpoints of an earlier run first.")

    def __post_init__(self):
        for name in ("max_unusable_answer_fraction", "max_overlong_prompt_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name} must be within [0, 1], got {getattr(self, name)}.")
        if self.num_eval_examples is not None and self.num_eval_examples < 0:
            raise ValueError(
                f"--num_eval_examples must be >= 0 (0: no held-out accuracy), got {self.num_eval_examples}."
            )


@dataclass(frozen=True)
class Deferred:
    """A default that depends on the model or device: the help shows `shown`; `resolve(namespace, embedded)`."""

    shown: str
    resolve: Callable[[argparse.Namespace, bool], Any]

    def __str__(self) -> str:
        return self.shown


def by_model(embedded: Any, named: Any) -> Deferred:
    """`embedded` for the embedded tiny policy, `named` for a named model."""
    return Deferred(
        f"{embedded} (embedded policy), {named} (named model)", lambda _, tiny: embedded if tiny else named
    )


def deferred_defaults(method: str) -> dict[str, Any]:
    """`trl_groupopt.cli.defaults`' layers as parser defaults: RUN_DEFAULTS, then per-model values."""
    spec = get_method(method)
    embedded = {**EMBEDDED_POLICY_DEFAULTS, **spec.demo_defaults}
    defaults = {f.name: f.default for f in dataclasses.fields(spec.config_class) if f.name in embedded}
    defaults.update(RUN_DEFAULTS)  # what a named model gets
    defaults.update({name: by_model(value, defaults[name]) for name, value in embedded.items()})

    def output_dir(namespace: argparse.Namespace, tiny: bool) -> str:
        name = "demo" if tiny else os.path.basename(os.path.normpath(namespace.model_name_or_path))
        return os.path.join("outputs", f"{method}-{name}")

    def bf16(namespace: argparse.Namespace, tiny: bool) -> bool:  # the tiny policy trains in fp32 everywhere
        return not tiny and not namespace.fp16 and device_supports_bf16(namespace.use_cpu)

    return {
        **defaults,
        "model_name_or_path": Deferred("the embedded tiny policy", lambda _, tiny: offline.EMBEDDED_POLICY_PATH),
        "output_dir": Deferred(f"outputs/{method}-demo, or outputs/{method}-<model name>", output_dir),
        "use_cpu": Deferred("True unless an accelerator is visible", lambda *_: not has_accelerator()),
        "bf16": Deferred("False for the embedded policy, else True where the device runs bf16 natively", bf16),
    }


def _option_groups(config_class: type) -> dict[str, str]:
    """dest -> the help group's key: "own" (fields the method's module adds), "set" (TRL fields it redeclares),
    "shared" (fields every trl-groupopt config adds), "script", "trl", "model", "transformers"."""
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    groups = dict.fromkeys((f.name for f in dataclasses.fields(TrainingArguments)), "transformers")
    groups.update(dict.fromkeys(trl_fields - set(groups), "trl"))
    groups.update(dict.fromkeys((f.name for f in dataclasses.fields(ModelConfig)), "model"))
    for cls in reversed(config_class.__mro__):  # the most derived class wins
        if cls.__module__.startswith("trl_groupopt."):
            key = "own" if cls.__module__ == config_class.__module__ else "shared"
            groups.update({name: "set" if name in trl_fields else key for name in inspect.get_annotations(cls)})
    groups.update(dict.fromkeys((f.name for f in dataclasses.fields(DemoScriptArguments)), "script"))
    groups["resume_from_checkpoint"] = "script"
    return groups


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Defaults after each option, as TRL's parser shows them; group descriptions as written."""


class MethodParser(TrlParser):
    """`TrlParser((DemoScriptArguments, <Method>Config, ModelConfig))`, with the hooks of the module docstring."""

    def __init__(self, method: str, prog: str):
        spec = get_method(method)
        self._route, self._groups, self._flags = _option_groups(spec.config_class), {}, []
        self._titles = {
            "own": (
                f"{method} options: {spec.summary or spec.trainer_name}",
                f"  {spec.trainer_name}, {spec.paper}"
                + ("" if "own" in self._route.values() else ": no options of its own (TRL's options below)"),
            ),
            "set": (f"TRL options {method} sets its own default for", None),
            "shared": ("options every trl-groupopt method adds", None),
            "script": ("script options (data, rewards, the run)", adapters.format_help()),
            "trl": ("TRL GRPOConfig", None),
            "model": ("TRL ModelConfig: model loading, LoRA (PEFT), quantization", None),
            "transformers": ("transformers TrainingArguments", None),
        }
        super().__init__(
            (DemoScriptArguments, spec.config_class, ModelConfig),
            prog=prog,
            usage="%(prog)s [--config YAML] [--OPTION VALUE ...]",
            formatter_class=_HelpFormatter,
            description=f"Train with {spec.trainer_name} ({spec.paper}). Errors print one line; a bare --debug "
            "prints the traceback.",
        )
        self.add_argument(
            "--config",
            metavar="YAML",
            default=argparse.SUPPRESS,
            help="a YAML file of option: value pairs (and env: variables); the command line overrides it",
        )
        self.set_defaults(**deferred_defaults(method))

    def add_argument(self, *flags: str, **kwargs: Any) -> argparse.Action:
        self._flags.extend(flags)
        dest = kwargs.get("dest") or next((f for f in flags if f.startswith("--")), flags[0]).lstrip("-")
        key = self._route.get(dest.replace("-", "_"))
        if dest == "resume_from_checkpoint":
            kwargs["help"] = "Resume the run of --output_dir: 'last' (its newest complete checkpoint) or a path."
        if key is not None and not self._groups:  # the order of the help, whatever order the fields come in
            self._groups = {name: self.add_argument_group(*self._titles[name]) for name in self._titles}
        target = super() if key is None else self._groups[key]
        return target.add_argument(*flags, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")  # one line, as `trl_groupopt.cli.main.die`

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        if rest:
            self.error(unknown_option(rest, self._flags))
        tiny = isinstance(namespace.model_name_or_path, Deferred) or uses_embedded_policy(namespace.model_name_or_path)
        for dest in sorted(vars(namespace), key=lambda d: d == "bf16"):  # bf16 reads use_cpu
            if isinstance(value := getattr(namespace, dest), Deferred):
                setattr(namespace, dest, value.resolve(namespace, tiny))
        # before any config is built: TRL's `__post_init__` would divide by a 0 count, the rest fail after the model
        problems = option_problems(namespace, unset_ok=True)
        if problems:
            self.error("; ".join(f"--{name} {_cli_value(value)}: {fix}" for name, value, fix in problems) + ".")
        weights, funcs = getattr(namespace, "reward_weights", None), getattr(namespace, "reward_funcs", None)
        if weights is not None and funcs is not None and len(weights) != len(funcs):
            self.error(
                f"--reward_weights {_cli_value(weights)}: give one weight per --reward_funcs ({' '.join(funcs)})."
            )
        return namespace, rest

    def parse_args_and_config(self, args: Sequence[str], *rest: Any, **kwargs: Any):
        # TRL reads `--config PATH` only; argparse reads `--learning_rate -1e-4` as two options (only `-1`, `-.5` as
        # numbers): a negative number after an option is joined to it, as `--learning_rate=-1e-4` is read
        args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
        args = _join_negative_values(args)
        self._config = args[args.index("--config") + 1] if "--config" in args[:-1] else None
        if "--config" in args and (self._config is None or not os.path.isfile(self._config)):
            self.error(f"--config {self._config or ''}: no such file.")
        try:
            return super().parse_args_and_config(args, *rest, **kwargs)
        except yaml.YAMLError as err:
            self.error(f"--config {self._config} is not valid YAML: {err}")

    def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
        unknown = super().set_defaults_with_config(**kwargs)[::2]
        if unknown:
            keys = [flag[2:] for flag in self._flags if flag.startswith("--")]
            self.error(f"--config {self._config}: " + unknown_option([u[2:] for u in unknown], keys, "key"))
        return []


#: A negative number argparse reads as an option (it reads `-1`, `-.5` as numbers): `-1e-4`, `-1E4`, `-inf`.
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)[eE][-+]?\d+$|^-(inf|infinity|nan)$|^-\d+\.$", re.IGNORECASE)


def _join_negative_values(args: Sequence[str]) -> list[str]:
    """`args` with each such number after an option joined to it (``--learning_rate=-1e-4``)."""
    joined: list[str] = []
    for arg in args:
        if joined and _NEGATIVE_NUMBER.match(arg) and joined[-1].startswith("--") and "=" not in joined[-1]:
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


def _cli_value(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def unknown_option(unknown: Sequence[str], known: Sequence[str], what: str = "option") -> str:
    """``unknown option --lerning_rate (did you mean --learning_rate?); --help lists them``."""
    names = [u for u in unknown if u.startswith("-")] or list(unknown)
    close = difflib.get_close_matches(names[0], known, n=1)
    return f"unknown {what} {' '.join(names)}{f' (did you mean {close[0]}?)' if close else ''}; --help lists them"


def _build_trainer(method, script_args, training_args, model_args, train_dataset):
    """The method's trainer as TRL's grpo.py builds it, with the readable progress callback."""
    spec = get_method(method)
    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)  # fmt: skip
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}
    trainer = spec.trainer_class(
        model=model_args.model_name_or_path,
        reward_funcs=[REWARD_FUNCS[name] for name in script_args.reward_funcs],
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
    )
    for callback in (ProgressCallback, PrinterCallback, MechanismReportCallback):  # the first two: by disable_tqdm
        report = trainer.pop_callback(callback)  # the run's report last: its lines come after the bar closes
    trainer.add_callback(ReadableProgressCallback(spec.headline_metric, show_bar=not training_args.disable_tqdm))
    trainer.add_callback(stop.safe_points())  # a stop signal dropped where it landed ends the run at the step's end
    trainer.add_callback(report)
    return trainer


class _FinishRun(TrainerCallback):
    """The command's lines around training and its outputs (the held-out accuracy after, the model, card, state,
    plot, results.json, the push), written at the end of `train()`, in the opened run (its lock held)."""

    def __init__(self, trainer, method, script_args, training_args, model_args, eval_dataset, say, history, decode):
        self.trainer, self.method, self.say, self.history = trainer, method, say, history  # history: the whole run's
        self.script_args, self.decode = script_args, decode  # decode: the held-out decoding settings, before and after
        self.training_args, self.model_args, self.eval_dataset = training_args, model_args, eval_dataset
        self.before: float | None = None  # the held-out accuracy before training, when measured (and its curve)
        self.curve: HeldOutAccuracyCallback | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        steps = f"{args.max_steps} steps" if args.max_steps > 0 else "steps"
        self.say(f"training {steps}, {schedule_text(args, get_method(self.method).config_class)} -> {args.output_dir}")
        if self.trainer.resumed_from is not None:
            self.say(f"resuming from {self.trainer.resumed_from}")

    def on_train_end(self, args, state, control, **kwargs):
        self.write_outputs()

    def write_outputs(self) -> None:
        """The held-out accuracy after training and the final outputs, recorded last: the run is finished then."""
        trainer, training_args = self.trainer, self.training_args
        remove_record(training_args.output_dir, FINAL_RECORD)  # outputs rewritten: unfinished until recorded again
        if self.before is not None:
            after = offline.greedy_accuracy(trainer.model, trainer.processing_class, self.eval_dataset, **self.decode)
            after = after["accuracy"]
            self.say(f"held-out greedy accuracy ({len(self.eval_dataset)} prompts): {self.before:.1%} -> {after:.1%}")
            trainer.heldout_accuracy = {"before": self.before, "after": after, "num_examples": len(self.eval_dataset)}
        dataset_name = self.script_args.dataset_name or SYNTHETIC_DATASET_NAME  # the card describes the synthetic task
        trainer.save_model(training_args.output_dir)
        if trainer.accelerator.is_main_process:
            self._save_outputs(dataset_name)
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=dataset_name)
        trainer.accelerator.wait_for_everyone()  # every process's part of the model is saved
        if trainer.accelerator.is_main_process:  # trl_groupopt/runfolder/resume.py, `decide`, reads it
            write_final_record(training_args.output_dir, trainer.state.global_step)

    def _save_outputs(self, dataset_name: str) -> None:
        """The card, trainer state, plot and results.json beside the saved model (main process)."""
        trainer, training_args, curve, method = self.trainer, self.training_args, self.curve, self.method
        trainer.create_model_card(dataset_name=dataset_name)  # after save_model: replaces PEFT's template card
        trainer.save_state()
        heldout = trainer.heldout_accuracy or {}
        before, after = heldout.get("before", float("nan")), heldout.get("after", float("nan"))
        report = trainer.mechanism_report
        reporting.plot_reward_accuracy(
            trainer.state.log_history,
            os.path.join(training_args.output_dir, "reward_accuracy.png"),
            heldout=[(0, before), (trainer.state.global_step, after)] if heldout else [],
            heldout_curve=curve.points if curve else [],
            heldout_label=f"accuracy (held-out, greedy, {heldout.get('num_examples')} prompts)",
            curve_label=f"accuracy (held-out, greedy, first {len(curve.dataset)} prompts)" if curve else "",
            mechanism_report=report,
            title=f"{method}: {os.path.basename(os.path.normpath(self.model_args.model_name_or_path))}",
        )
        reporting.write_results(
            training_args.output_dir,
            method=method,
            accuracy_before=before,
            accuracy_after=after,
            heldout_examples=heldout.get("num_examples"),
            heldout_curve=[list(point) for point in curve.points] if curve else [],
            heldout_curve_examples=len(curve.dataset) if curve else None,
            mechanism=report.to_dict() if report is not None else None,
            no_signal_steps=(trainer.no_signal_steps or (0, 0))[0],
            steps=trainer.state.global_step,
            wall_seconds=round(self.history.wall_seconds, 1),
            num_processes=trainer.accelerator.num_processes,
        )
        self.say(
            f"saved the model, README.md (card), trainer_state.json, results.json and plots in {training_args.output_dir}"
        )


def run(method, script_args, training_args, model_args, demo, train_dataset, eval_dataset=None, opened=None):
    """Train `method` in the run the command opened, then write the model, card, state and results (only those for a
    run trained to its end); returns the trainer. Warnings show no source line of this package (`plain_warnings`)."""
    with plain_warnings():
        return _run(method, script_args, training_args, model_args, demo, train_dataset, eval_dataset, opened)


def _run(method, script_args, training_args, model_args, demo, train_dataset, eval_dataset, opened):
    if training_args.use_cpu or not torch.cuda.is_available():  # docs/getting-started.md, "Threads on CPU"
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        tiny = uses_embedded_policy(model_args.model_name_or_path)  # one thread per process, else the cores shared
        torch.set_num_threads(1 if tiny else max(1, (os.cpu_count() or 1) // local_processes))
    history = RunHistoryCallback.of_checkpoint(opened.checkpoint if opened is not None else None)
    trainer = _build_trainer(method, script_args, training_args, model_args, train_dataset)
    trainer.add_callback(history)  # saved in every checkpoint: a resumed run reports the whole run
    trainer.opened_run = opened  # `train()` takes it: the lock and the resume rules once per run
    main = trainer.accelerator.is_main_process

    def say(text: str) -> None:
        if main:
            print(f"[{method}] {text}", flush=True)

    # one process measures; the others wait at training's first collective. Held-out rows: the synthetic task's for
    # the embedded policy, those carved from the user's --dataset_name (not the synthetic task for a named model).
    evaluate = (demo or script_args.dataset_name is not None) and script_args.evaluate_accuracy
    evaluate = evaluate and eval_dataset is not None and main
    decode = {} if demo else {"max_new_tokens": training_args.max_completion_length}
    finish = _FinishRun(trainer, method, script_args, training_args, model_args, eval_dataset, say, history, decode)
    trainer.add_callback(finish)
    if evaluate:  # a resumed run's was measured before its first session
        model, tokenizer = trainer.model, trainer.processing_class
        measure = lambda: offline.greedy_accuracy(model, tokenizer, eval_dataset, **decode)["accuracy"]  # noqa: E731
        finish.before = history.before_accuracy(measure, say, len(eval_dataset))
    if evaluate and demo and script_args.heldout_eval_steps > 0:
        subset = eval_dataset.select(range(min(script_args.heldout_eval_examples, len(eval_dataset))))
        finish.curve = HeldOutAccuracyCallback(trainer, subset, script_args.heldout_eval_steps, history.curve)
        trainer.add_callback(finish.curve)
    trainer.train()  # in `opened`, which decided the checkpoint
    if trainer.finished is not None:  # its training was complete (loaded, not trained): the outputs are written now
        finish.write_outputs()
    return trainer
