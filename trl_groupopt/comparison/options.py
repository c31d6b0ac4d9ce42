"""The options of `trl-groupopt compare` (`Options`, `parse_options`), the command they make, and the checks that
refuse bad input before anything runs or is submitted, with one line naming the fix (`check`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..methods.registry import METHODS
from . import local, slurm
from . import seeds as seedplan
from .argv import scan, secret_values, take_secrets, train_options

#: Options `compare` sets on each run itself.
OWN_OPTIONS = ("method", "output_dir", "seed")
#: Rows held out of a user's dataset (the synthetic task: prompts of its test split), unless --eval_examples says.
DEFAULT_EVAL_EXAMPLES = 200
PROG = "trl-groupopt compare"
DESCRIPTION = "Does a method beat the baseline on your model and task? Paired seeds, intervals that hold together at 95% (docs/compare.md)."
LAUNCHERS = ("local", "slurm")


class CompareError(ValueError):
    """Bad input, found before the first run: the message is one line that names the fix."""


@dataclass
class Options:
    """A comparison as asked: `train_args` are passed to every run (without secrets: `secrets` reach the runs
    through their environment only, `argv.take_secrets`)."""

    methods: list[str]
    seeds: int | str  # N, or "auto" (seeds.py)
    output_dir: str
    baseline: str = "grpo"
    workers: int = 1
    eval_examples: int = DEFAULT_EVAL_EXAMPLES
    train_args: list[str] = field(default_factory=list)
    launcher: str = "local"
    gpus_per_run: int | None = None  # local: devices per run (None: 1)
    devices: list[str] | None = None  # local: the devices to use (None: every one here)
    max_seeds: int = seedplan.MAX_SEEDS
    pilot_seeds: int = seedplan.PILOT_SEEDS
    slurm: slurm.SlurmOptions = field(default_factory=slurm.SlurmOptions)
    cancel: bool = False
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    #: the `--seeds auto` options given on the command line (`--seeds N` refuses them)
    seed_options_given: tuple[str, ...] = ()

    @property
    def settings(self) -> dict[str, Any]:
        """What every run of DIR must share (a run's key is its method and seed under these): the train options as
        given and as read (`argv.train_options`: `other_settings` compares these), the held-out size."""
        return {"train_args": list(self.train_args), "train_options": train_options(self.train_args),
                "eval_examples": self.eval_examples}  # fmt: skip


def other_settings(made: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """How the settings a run was `made` with differ from those `wanted` (`Options.settings`; a record written
    before `train_options` was recorded: read from its `train_args`), or None: `--max_steps 3 there, 5 here`."""
    had = made.get("train_options")
    had = had if isinstance(had, dict) else train_options(made.get("train_args") or [])
    want = wanted["train_options"]
    differ = [f"--{k} {had.get(k, '(absent)')} there, {want.get(k, '(absent)')} here"
              for k in sorted(set(had) | set(want)) if had.get(k) != want.get(k)]  # fmt: skip
    if made.get("eval_examples") != wanted["eval_examples"]:
        differ.append(f"--eval_examples {made.get('eval_examples')} there, {wanted['eval_examples']} here")
    return "; ".join(differ) or None


def _parser() -> argparse.ArgumentParser:
    epilog = ("Any other option is a `train` option, passed to every run (trl-groupopt train --method NAME --help "
              "lists them). See docs/compare.md.")  # fmt: skip
    # no abbreviations: `--seed 3`, a train option, must not be read as `--seeds 3`
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=DESCRIPTION, epilog=epilog)
    add = parser.add_argument
    add("--methods", help="comma-separated methods, the baseline among them")
    add("--seeds", help="seeds 0..N-1 per method (at least 2), or auto: a pilot, then the seeds it shows are needed")
    add("--output_dir", required=True, help="runs.jsonl, compare.json/.md/.png and the runs")
    add("--baseline", default="grpo", help="the method the others are paired against")
    add("--workers", type=int, default=1, help="runs at once, on the CPU (default 1)")
    add("--eval_examples", type=int, default=DEFAULT_EVAL_EXAMPLES,
        help="held-out prompts every run is scored on, before and after training")  # fmt: skip
    add("--pilot_seeds", type=int, help=f"--seeds auto: the pilot's seeds (default {seedplan.PILOT_SEEDS})")
    add("--max_seeds", type=int, help=f"--seeds auto: at most this many (default {seedplan.MAX_SEEDS})")
    add("--launcher", choices=LAUNCHERS, default="local", help="local: this machine (default); slurm: a job per run")
    add("--gpus_per_run", type=int, help="local: devices per run (default 1; N > 1: accelerate launch)")
    add("--devices", help="local: comma-separated devices to use (default: every GPU here)")
    add("--cancel", action="store_true", help="slurm: cancel this comparison's queued and running jobs")
    add("--slurm_partition", help="slurm: the partition (default: the cluster's default)")
    add("--slurm_time", help="slurm: each job's time limit (minutes, H:MM:SS or D-HH:MM:SS)")
    add("--slurm_gpus_per_run", type=int, default=1, help="slurm: GPUs per job (default 1; 0: CPU jobs)")
    add("--slurm_cpus_per_run", type=int, help="slurm: CPUs per job (default: the partition's)")
    add("--slurm_mem", help="slurm: memory per job, e.g. 32G (default: the partition's)")
    add("--slurm_account", help="slurm: the account to charge")
    add("--slurm_setup", action="append", default=[], help="slurm: a line run before each job (repeatable)")
    return parser


def parse_options(argv: Sequence[str]) -> Options:
    """`Options` from the command line; the options `compare` does not know are train options."""
    known, rest = _parser().parse_known_args(list(argv))
    methods = [m.strip() for m in (known.methods or "").split(",") if m.strip()]
    count: int | str | None = known.seeds
    if count is not None and count != seedplan.AUTO:
        count = int(count) if count.strip().lstrip("-").isdigit() else count
    train_args, secrets = take_secrets(rest)
    slurm_options = slurm.SlurmOptions(known.slurm_partition, known.slurm_time, known.slurm_gpus_per_run,
                                       known.slurm_cpus_per_run, known.slurm_mem, known.slurm_account,
                                       known.slurm_setup)  # fmt: skip
    devices = [d.strip() for d in known.devices.split(",")] if known.devices is not None else None  # "" kept: refused
    given = tuple(f"--{name}" for name in ("pilot_seeds", "max_seeds") if getattr(known, name) is not None)
    max_seeds = seedplan.MAX_SEEDS if known.max_seeds is None else known.max_seeds
    pilot = seedplan.PILOT_SEEDS if known.pilot_seeds is None else known.pilot_seeds
    return Options(methods, count, known.output_dir, known.baseline, known.workers, known.eval_examples, train_args,
                   known.launcher, known.gpus_per_run, devices, max_seeds, pilot, slurm_options, known.cancel,
                   secrets, given)  # fmt: skip


def _check_methods(options: Options) -> None:
    known = ", ".join(METHODS)
    if not options.methods:
        example = ",".join(list(METHODS)[:2])
        raise CompareError(f"--methods is empty: name two or more of {known}, e.g. --methods {example}.")
    for method in options.methods:
        if method not in METHODS:
            raise CompareError(f"--methods: unknown method {method!r}; choose from {known}.")
    if len(set(options.methods)) != len(options.methods):
        raise CompareError("--methods names a method twice: name each once.")
    if options.baseline not in options.methods:
        raise CompareError(f"--baseline {options.baseline} is not in --methods {','.join(options.methods)}: add it "
                           "to --methods, or choose one of them with --baseline.")  # fmt: skip
    if len(options.methods) < 2:
        raise CompareError(f"--methods {options.methods[0]}: name a method to compare with the baseline too.")


def _check_seeds(options: Options) -> None:
    if options.seeds == seedplan.AUTO:
        if options.pilot_seeds < 2:
            raise CompareError(f"--pilot_seeds {options.pilot_seeds}: a pilot needs at least 2 seeds (default "
                               f"{seedplan.PILOT_SEEDS}).")  # fmt: skip
        if options.max_seeds < options.pilot_seeds:
            raise CompareError(f"--max_seeds {options.max_seeds} is below the pilot of {options.pilot_seeds} seeds: "
                               "raise --max_seeds, or lower --pilot_seeds.")  # fmt: skip
        return
    if options.seeds is None:
        raise CompareError("--seeds is required: N (seeds 0..N-1, at least 2), or auto (docs/compare.md).")
    if not isinstance(options.seeds, int) or options.seeds < 2:
        raise CompareError(f"--seeds {options.seeds}: a paired interval needs at least 2 seeds; pass --seeds 2 or "
                           "more (docs/compare.md: 8 for a first look), or --seeds auto.")  # fmt: skip
    if options.seed_options_given:
        raise CompareError(f"{', '.join(options.seed_options_given)}: only --seeds auto plans seeds (--seeds "
                           f"{options.seeds} runs seeds 0..{options.seeds - 1}); drop them, or pass --seeds auto.")  # fmt: skip


def _check_launcher(options: Options) -> local.Placement | None:
    """The local placement of the runs (None for Slurm), or CompareError."""
    given = [name for name, value in (("--gpus_per_run", options.gpus_per_run), ("--devices", options.devices),
                                      ("--workers", options.workers if options.workers != 1 else None))
             if value is not None]  # fmt: skip
    if options.launcher == "slurm":
        if given:
            raise CompareError(f"{', '.join(given)}: with --launcher slurm each job gets what --slurm_gpus_per_run "
                               "and --slurm_cpus_per_run ask for; drop them.")  # fmt: skip
        if any(value in line for line in options.slurm.setup for value in secret_values(options.secrets)):
            raise CompareError("--slurm_setup holds a secret's value, which the sbatch script would keep: read it "
                               "from a file in the line instead, e.g. 'export HF_TOKEN=$(cat ~/.hf_token)'.")  # fmt: skip
        if problem := slurm.check(options.slurm):
            raise CompareError(problem)
        return None
    if asked := [f"--slurm_{name}" for name, value in vars(options.slurm).items()
                 if value != getattr(slurm.SlurmOptions(), name)]:  # fmt: skip
        raise CompareError(f"{', '.join(asked)}: these are for --launcher slurm; add it, or drop them.")
    if options.devices is not None and (not options.devices or "" in options.devices):
        raise CompareError(f"--devices {','.join(options.devices)!r} names an empty device: list devices such as "
                           "--devices 0,1, or drop --devices to use every GPU here (none: the CPU).")  # fmt: skip
    if options.gpus_per_run is not None and options.gpus_per_run < 1:
        raise CompareError(f"--gpus_per_run {options.gpus_per_run}: a run needs at least 1 device; pass "
                           "--gpus_per_run 1 or more, or drop --devices and --gpus_per_run to train on the CPU.")  # fmt: skip
    use_cpu = scan(options.train_args, "use_cpu")[0]["use_cpu"]
    placed = local.place(options.devices, options.gpus_per_run or 1, options.workers,
                         use_cpu is not None and use_cpu.lower() not in ("false", "0", "no"))  # fmt: skip
    if isinstance(placed, str):
        raise CompareError(placed)
    if idle := placed.devices[placed.per_run * placed.concurrency :]:
        print(f"{PROG}: warning: --gpus_per_run {placed.per_run} on devices {','.join(placed.devices)} leaves "
              f"{','.join(idle)} idle; list {placed.per_run * placed.concurrency} devices with --devices, or pass a "
              "--gpus_per_run that divides their count.", file=sys.stderr, flush=True)  # fmt: skip
    return placed


def _train_parse(method: str, args: Sequence[str]) -> tuple[argparse.Namespace | None, str | None]:
    """`args` as train's parser for `method` reads them (TRL imported here): (namespace, None), or (None, its one-line
    error without the program's name)."""
    from ..cli.script import MethodParser

    parser, said = MethodParser(method, PROG), io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parser.parse_known_args(list(args))[0], None
    except SystemExit:
        return None, said.getvalue().strip().partition("error: ")[2] or said.getvalue().strip()


def _check_train_options(options: Options) -> None:
    """Every method's train parser reads the train options (an option only some methods have would fail their runs
    one by one), and they measure held-out accuracy (`--no_evaluate_accuracy` would train and judge nothing)."""
    from ..cli.main import take_imports

    train_args = take_imports(options.train_args)[0]  # `--import`s are read before train's parser, in every run
    for method in options.methods:
        namespace, problem = _train_parse(method, train_args)
        if problem is not None:
            raise CompareError(f"--method {method} refuses the train options: {problem.rstrip('.')}; every method "
                               "gets them, so compare methods at their defaults, or give each variant its own "
                               "--output_dir.")  # fmt: skip
        if namespace is not None and getattr(namespace, "evaluate_accuracy", True) is False:
            raise CompareError("--no_evaluate_accuracy (--evaluate_accuracy false): compare judges the methods by held-out accuracy, which it "
                               "turns off (the runs would train and measure nothing); drop it.")  # fmt: skip


def check(options: Options) -> local.Placement | None:
    """Refuse bad input before the first run (or job), with one line naming the fix; the local placement of the runs
    (None for Slurm)."""
    _check_methods(options)
    _check_seeds(options)
    if options.workers < 1 or options.eval_examples < 1:
        raise CompareError("--workers and --eval_examples must be at least 1.")
    given, _ = scan(options.train_args, "num_eval_examples", *OWN_OPTIONS)
    if given["num_eval_examples"] is not None:
        raise CompareError("--num_eval_examples: compare sets the held-out size of every run; use --eval_examples.")
    if own := [f"--{name}" for name in OWN_OPTIONS if given[name] is not None]:
        raise CompareError(f"{', '.join(own)}: compare sets these for each run (DIR/runs/METHOD-SEED); use "
                           "--methods, --seeds and --output_dir.")  # fmt: skip
    placement = _check_launcher(options)
    _check_train_options(options)
    return placement


def command_line(options: Options) -> str:
    """The command (its secrets left out: they reach the runs through the environment)."""
    words = ["trl-groupopt", "compare", "--methods", ",".join(options.methods), "--seeds", str(options.seeds),
             "--output_dir", options.output_dir, "--baseline", options.baseline]  # fmt: skip
    defaults = Options([], 2, "")
    for name in ("workers", "eval_examples", "max_seeds", "pilot_seeds", "launcher", "gpus_per_run"):
        if getattr(options, name) != getattr(defaults, name) or name == "eval_examples":
            words += [f"--{name}", str(getattr(options, name))]
    if options.devices is not None:
        words += ["--devices", ",".join(options.devices)]
    for name, value in vars(options.slurm).items():
        for item in value if name == "setup" else [value]:
            if value != getattr(slurm.SlurmOptions(), name):
                words += [f"--slurm_{name}", str(item)]
    return shlex.join([*words, *options.train_args])
