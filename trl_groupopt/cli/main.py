"""The `trl-groupopt` command (`train`, `methods`, `compare`) and the example scripts' entry point (:func:`command`):
docs/getting-started.md ("The command line: help and errors"); the defaults' layers: `trl_groupopt.cli.defaults`.
This module imports no TRL: `--help`, `methods`, `train --help` and an unknown `--method` answer without it."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import inspect
import os
import shlex
import signal
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from ..data.offline import uses_embedded_policy
from ..methods.registry import METHODS, get_method, import_methods
from ..runfolder import stop
from ..runfolder.resume import DiskFullError
from ..runfolder.stop import Interrupted  # noqa: F401  (its home before issue 52)
from .defaults import DEMO_DEFAULTS, EMBEDDED_POLICY_DEFAULTS, RUN_DEFAULTS  # noqa: F401  (read here by benchmarks)

if TYPE_CHECKING:
    from ..trainer.base import GroupOptTrainer

DEBUG_ENVIRONMENT_VARIABLE = "TRL_GROUPOPT_DEBUG"


def die(prog: str, message: str, status: int = 2) -> NoReturn:
    """Print ``prog: error: message`` (one line) to stderr and exit."""
    sys.stderr.write(f"{prog}: error: {' '.join(message.split())}\n")
    raise SystemExit(status)


def parse(method: str, argv: Sequence[str] | None = None, *, prog: str | None = None):
    """(script_args, training_args, model_args, demo: the embedded policy on the synthetic task), parsed once."""
    get_method(method)  # an unknown name fails here, before TRL is imported
    from ..data.adapters import check_model_path
    from ..data.checks import DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
    from .script import MethodParser

    parser = MethodParser(method, prog or os.path.basename(sys.argv[0]))
    script_args, training_args, model_args = parser.parse_args_and_config(sys.argv[1:] if argv is None else argv)
    if not hasattr(training_args, "max_all_none_reward_batches"):  # plain GRPOConfig (grpo): stop on no reward too
        training_args.max_all_none_reward_batches = DEFAULT_MAX_ALL_NONE_REWARD_BATCHES
    check_model_path(model_args.model_name_or_path)
    demo = uses_embedded_policy(model_args.model_name_or_path) and script_args.dataset_name is None
    return script_args, training_args, model_args, demo


def train(method: str, argv: Sequence[str] | None = None, *, prog: str | None = None) -> GroupOptTrainer:
    """Parse argv and open the run (`trl_groupopt.runfolder.run.open_run`: its lock and the resume rules, worded for
    the command line) before the data is read and the model loads: a folder in use, another method's checkpoint or a
    fresh run over an earlier one refuse at once, and a finished run prints so and exits 0. Then check the data and
    train `method` within the opened run; returns the trainer. Errors raise (:func:`one_line_errors` prints them)."""
    from ..data import adapters
    from ..runfolder.run import open_run
    from . import script

    # TRL's GRPOConfig defaults `gradient_checkpointing`, a deprecated alias in transformers 5 (the method configs
    # resolve it silently; a plain GRPOConfig, `--method grpo`, warns): nothing a command-line user can change
    warnings.filterwarnings("ignore", message=r"`gradient_checkpointing` is deprecated", category=FutureWarning)
    script_args, args, model_args, demo = parse(method, argv, prog=prog)
    if os.path.isfile(args.output_dir):
        raise ValueError(f"--output_dir {args.output_dir} is a file: give a folder (new or a run's).")
    args.overwrite_output_dir = script_args.overwrite_output_dir  # read by the resume rules
    try:  # the lock removes the folder it created if the run leaves it empty
        with open_run(args, get_method(method).name, args.resume_from_checkpoint, cli=True) as opened:
            if opened.done is not None and opened.main:  # at its last step: finished, or only its outputs to write
                print(opened.done if opened.finished else f"[{method}] {opened.done}", flush=True)
            if opened.finished:  # nothing to do: exit 0 (a job-retry loop stops here)
                raise SystemExit(0)
            train_dataset, eval_dataset = adapters.load_datasets(script_args, model_args, args)
            stop.raise_pending()
            trainer = script.run(method, script_args, args, model_args, demo, train_dataset, eval_dataset, opened)
            stop.raise_pending()  # a signal dropped after the last step still stops the command, as a stop
            return trainer
    except KeyboardInterrupt as interrupt:
        interrupt.output_dir = args.output_dir  # what to do next depends on what the run left there
        raise


def take_debug_flag(argv: Sequence[str]) -> tuple[list[str], bool]:
    """(argv without a bare ``--debug``, whether the traceback is wanted); ``--debug VALUE`` is transformers'."""
    rest, debug = [], os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "").lower() in ("1", "true", "yes")
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            debug = True
        else:
            rest.append(arg)
    return rest, debug


def take_imports(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(argv without its ``--import MODULE`` / ``--import=MODULE`` options, the modules in order)."""
    rest, modules, words = [], [], iter(argv)
    for word in words:
        if word == "--import":
            module = next(words, None)
            if module is None or module.startswith("-"):
                die("trl-groupopt", "--import needs a module name, e.g. --import my_objectives")
            modules.append(module)
        elif word.startswith("--import="):
            modules.append(word.partition("=")[2])
        else:
            rest.append(word)
    return rest, modules


def _import_modules(modules: Sequence[str]) -> None:
    """Import the ``--import`` modules (which register their methods), the current directory searched first as
    `python -m` does (the console script does not); one that fails is one line, exit 2."""
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        import_methods(list(modules))
    except ValueError as err:
        die("trl-groupopt", str(err))


def _raised_while_training(error: BaseException) -> bool:
    """Whether `error` came from inside `Trainer.train` (a failure mid-run keeps its traceback)."""
    if (trainer_module := sys.modules.get("transformers.trainer")) is None:  # not imported: nothing was trained
        return False
    code = inspect.unwrap(trainer_module.Trainer.train).__code__
    return any(frame.f_code is code for frame, _ in traceback.walk_tb(error.__traceback__))


def _rerun_argv(argv: Sequence[str]) -> tuple[list[str], bool]:
    """(`argv` without a fresh run's or a resume's flags and without the hub token, whether a token was dropped)."""
    dropped = ("resume_from_checkpoint", "overwrite_output_dir", "hub_token")  # spelled with "_" or "-"
    kept, i, token = [], 0, False
    while i < len(argv):
        name = argv[i][2:].partition("=")[0].replace("-", "_") if argv[i].startswith("--") else None
        if name in dropped:  # and its value
            token = token or name == "hub_token"
            i += 1 + ("=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("-"))
            continue
        kept.append(argv[i])
        i += 1
    return kept, token


def after_interrupt(command_line: str, argv: Sequence[str], output_dir: str | None) -> str:
    """What works after an interrupted run, from what it left on disk: resuming its newest complete checkpoint, or,
    with none, running it again (with --overwrite_output_dir where an earlier run's files refuse a fresh run)."""
    from ..runfolder.checkpoints import newest_complete_checkpoint
    from ..runfolder.resume import refuse_fresh_run

    kept, token = _rerun_argv(argv)
    token_note = " (--hub_token left out: give it again, or set HF_TOKEN)" if token else ""
    if output_dir is not None and newest_complete_checkpoint(output_dir, warn=False) is not None:
        resume = shlex.join([*kept, "--resume_from_checkpoint", "last"])
        return f"Resume from the last checkpoint with: {command_line} {resume}{token_note}"
    try:
        refuse_fresh_run(output_dir, overwrite=False) if output_dir is not None else None
    except ValueError:
        kept.append("--overwrite_output_dir")  # what it left (incomplete checkpoints) would refuse a fresh run
    again = f"{command_line} {shlex.join(kept)}"
    return f"No checkpoint was saved, nothing to resume; run it again with: {again}{token_note}"


@contextlib.contextmanager
def one_line_errors(prog: str, debug: bool, command_line: str = "", argv: Sequence[str] = ()):
    """An error before training prints ``prog: error: message``, exit 1 (with `debug`, or raised while training: the
    traceback; a full disk is one line wherever it happens); Ctrl-C and SIGTERM print one line saying what to run
    next (:func:`after_interrupt`), exit 130 and 143, the run's lock released on the way."""
    handlers = (
        stop.arm()
    )  # a signal ends the command even where its exception is dropped (`trl_groupopt.runfolder.stop`)
    try:
        yield
        stop.raise_pending()
    except KeyboardInterrupt as interrupt:
        stop.ignore()
        traceback.clear_frames(interrupt.__traceback__)  # the run's objects (its progress bar) close first
        gc.collect()
        signum = getattr(interrupt, "signum", signal.SIGINT)
        said = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
        next_step = after_interrupt(command_line, argv, getattr(interrupt, "output_dir", None))
        sys.stderr.write(f"\n{prog}: {said}. {next_step}\n")
        raise SystemExit(128 + signum) from None
    except Exception as error:
        if debug or (_raised_while_training(error) and not isinstance(error, DiskFullError)):
            raise
        text = str(error) if isinstance(error, ValueError | OSError) else f"{type(error).__name__}: {error}"
        die(prog, f"{text} (--debug shows the traceback)", status=1)
    finally:
        stop.disarm(handlers)


def command(method: str) -> None:
    """The example scripts' entry point: train `method` with `sys.argv`, errors as :func:`one_line_errors`."""
    argv, debug = take_debug_flag(sys.argv[1:])
    prog = os.path.basename(sys.argv[0])
    with one_line_errors(prog, debug, f"python {shlex.quote(sys.argv[0])}", argv):
        train(method, argv, prog=prog)


def _methods_table() -> str:
    width = max(len(name) for name in METHODS)
    return "\n".join(f"  {name:<{width}}  {s.trainer_name}: {s.summary or s.paper}" for name, s in METHODS.items())


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        die(self.prog, message)


def main(argv: Sequence[str] | None = None) -> None:
    """`trl-groupopt train --method NAME [options]`, `trl-groupopt methods`, `trl-groupopt compare ...`."""
    argv, debug = take_debug_flag(sys.argv[1:] if argv is None else argv)
    argv, modules = take_imports(argv)
    _import_modules(modules)  # before the parser lists the methods
    imports = [word for module in modules for word in ("--import", module)]  # handed on: compare's runs, a rerun
    raw = argparse.RawDescriptionHelpFormatter
    epilog = (
        f"methods:\n{_methods_table()}\n\nexamples:\n"
        "  trl-groupopt train --method NAME                 # offline CPU demo (embedded policy)\n"
        "  trl-groupopt train --method NAME --import MODULE # a method MODULE registers (repeatable; compare too)\n"
        "  trl-groupopt train --method NAME --help          # every option of a method\n"
        "  trl-groupopt train --method NAME --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\\n"
        "      --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k"
    )
    parser = _OneLineParser(
        prog="trl-groupopt",
        description="Group RL objectives as drop-in TRL GRPOTrainer subclasses.",
        epilog=epilog,
        formatter_class=raw,
    )
    commands = parser.add_subparsers(dest="command", metavar="{train,methods,compare}", parser_class=_OneLineParser)
    train_parser = commands.add_parser(
        "train",
        add_help=False,
        formatter_class=raw,
        epilog=f"methods:\n{_methods_table()}",
        help="train a method; `train --method NAME --help` lists every option",
    )
    train_parser.add_argument("--method", choices=list(METHODS), help="the method to train (see below)")
    commands.add_parser("methods", help="list the registered methods")
    commands.add_parser("compare", add_help=False, help="compare methods (`compare --help`)")
    known, rest = parser.parse_known_args(argv)
    if known.command == "methods":
        print(_methods_table())
    elif known.command == "compare":  # the imports go on to every run, as a train option
        sys.exit(importlib.import_module("trl_groupopt.comparison.driver").main([*rest, *imports]))
    elif known.command == "train" and known.method is not None:
        prog = f"trl-groupopt train --method {known.method}"
        with one_line_errors(prog, debug, shlex.join([*prog.split(), *imports]), rest):
            train(known.method, rest, prog=prog)
    elif known.command == "train" and {"-h", "--help"} & set(rest):
        train_parser.print_help()
        print("\nAdd --method NAME --help for the method's options: trl-groupopt train --method NAME --help")
        sys.exit(0)
    elif known.command == "train":
        train_parser.error(f"--method is required; one of {', '.join(METHODS)}")
    else:
        parser.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
