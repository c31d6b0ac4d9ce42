"""`trl-groupopt compare`: does a method beat the baseline on your model and task? Paired seeds, 95% intervals.

Each (method, seed) is one `train` run in DIR/runs/M-S, scored on a held-out split they share (docs/compare.md)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..methods.registry import METHODS
from . import runs as runfile
from . import stats
from .report import describe, markdown, write_plot

#: Options `compare` sets on each run itself.
OWN_OPTIONS = ("method", "output_dir", "seed")
#: Options naming the user's data: replaced, for the runs, by the training part of the carved split.
DATA_OPTIONS = ("dataset_name", "dataset_config", "dataset_format", "dataset_train_split")
#: Rows held out of a user's dataset (the synthetic task: prompts of its test split), unless --eval_examples says.
DEFAULT_EVAL_EXAMPLES = 200
CARVE_SEED = 0  # the held-out rows of a user's dataset: the first --eval_examples of a shuffle with this seed
PROG = "trl-groupopt compare"


class CompareError(ValueError):
    """Bad input, found before the first run: the message is one line that names the fix."""


@dataclass
class Options:
    """A comparison as asked: `train_args` are passed to every run."""

    methods: list[str]
    seeds: int
    output_dir: str
    baseline: str = "grpo"
    workers: int = 1
    eval_examples: int = DEFAULT_EVAL_EXAMPLES
    train_args: list[str] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, Any]:
        """What every run of DIR must share (a run's key is its method and seed under these)."""
        return {"train_args": list(self.train_args), "eval_examples": self.eval_examples}


def parse_options(argv: Sequence[str]) -> Options:
    """`Options` from the command line; the options `compare` does not know are train options."""
    epilog = ("Any other option is a `train` option, passed to every run (trl-groupopt train --method NAME --help "
              "lists them). See docs/compare.md.")  # fmt: skip
    # no abbreviations: `--seed 3`, a train option, must not be read as `--seeds 3`
    description = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=description, epilog=epilog)
    parser.add_argument("--methods", required=True, help="comma-separated methods, the baseline among them")
    parser.add_argument("--seeds", type=int, required=True, help="seeds 0..N-1 per method (at least 2)")
    parser.add_argument("--output_dir", required=True, help="runs.jsonl, compare.json/.md/.png and the runs")
    parser.add_argument("--baseline", default="grpo", help="the method the others are paired against")
    parser.add_argument("--workers", type=int, default=1, help="runs at once, on the CPU (default 1)")
    parser.add_argument("--eval_examples", type=int, default=DEFAULT_EVAL_EXAMPLES,
                        help="held-out prompts every run is scored on, before and after training")  # fmt: skip
    known, rest = parser.parse_known_args(list(argv))
    methods = [m.strip() for m in known.methods.split(",") if m.strip()]
    return Options(methods, known.seeds, known.output_dir, known.baseline, known.workers, known.eval_examples, rest)


def _scan(args: Sequence[str], *names: str) -> tuple[dict[str, str | None], list[str]]:
    """The values of the options `names` in `args` (`--a_b V`, `--a-b=V`; the last wins; "" without a value, None
    when absent) and the other args, in order."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in names:
        parser.add_argument(*{f"--{name}", f"--{name.replace('_', '-')}"}, dest=name, nargs="?", const="")
    known, rest = parser.parse_known_args(list(args))
    return vars(known), rest


def check(options: Options) -> None:
    """Refuse bad input before the first run, with one line naming the fix."""
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
    if options.seeds < 2:
        raise CompareError(f"--seeds {options.seeds}: a paired interval needs at least 2 seeds; pass --seeds 2 or "
                           "more (docs/compare.md: 8 for a first look, the power note says how many to decide).")  # fmt: skip
    if options.workers < 1 or options.eval_examples < 1:
        raise CompareError("--workers and --eval_examples must be at least 1.")
    given, _ = _scan(options.train_args, "num_eval_examples", "use_cpu", *OWN_OPTIONS)
    if given["num_eval_examples"] is not None:
        raise CompareError("--num_eval_examples: compare sets the held-out size of every run; use --eval_examples.")
    if own := [f"--{name}" for name in OWN_OPTIONS if given[name] is not None]:
        raise CompareError(f"{', '.join(own)}: compare sets these for each run (DIR/runs/METHOD-SEED); use "
                           "--methods, --seeds and --output_dir.")  # fmt: skip
    if options.workers > 1 and given["use_cpu"] is None:
        from ..trainer.device import has_accelerator

        if has_accelerator():
            raise CompareError(f"--workers {options.workers}: runs share one accelerator one at a time; drop "
                               "--workers, or add --use_cpu true to train them on the CPU.")  # fmt: skip


def carve_heldout(options: Options, data_dir: Path) -> tuple[list[str], bool]:
    """(every run's train options, whether compare scores DATA/heldout.jsonl itself): the held-out split every run
    shares, carved once from `--dataset_name` (`CARVE_SEED`; the rest in DATA/train.jsonl). See docs/compare.md."""
    from ..data.offline import make_arithmetic_dataset, uses_embedded_policy

    given, rest = _scan(options.train_args, *DATA_OPTIONS)
    name, heldout_path, train_path = given["dataset_name"], data_dir / "heldout.jsonl", data_dir / "train.jsonl"
    if name is None:
        if uses_embedded_policy(_scan(options.train_args, "model_name_or_path")[0]["model_name_or_path"]):
            return [*options.train_args, "--num_eval_examples", str(options.eval_examples)], False
        if not heldout_path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            test = make_arithmetic_dataset(options.eval_examples, seed=0, split="test")
            test.select_columns(["prompt", "solution"]).to_json(str(heldout_path), lines=True)
        return list(options.train_args), True
    if not (train_path.exists() and heldout_path.exists()):
        from ..data.adapters import load_raw_dataset, to_prompt_solution

        raw = load_raw_dataset(name, given["dataset_config"], given["dataset_train_split"] or "train")
        data = to_prompt_solution(raw, given["dataset_format"] or "prompt-answer")
        if len(data) <= options.eval_examples:
            raise CompareError(f"--dataset_name {name} has {len(data)} rows, not more than --eval_examples "
                               f"{options.eval_examples}: lower --eval_examples so rows are left to train on.")  # fmt: skip
        data = data.select_columns(["prompt", "solution"]).shuffle(seed=CARVE_SEED)
        data_dir.mkdir(parents=True, exist_ok=True)
        data.select(range(options.eval_examples)).to_json(str(heldout_path), lines=True)
        data.select(range(options.eval_examples, len(data))).to_json(str(train_path), lines=True)
    return [*rest, "--dataset_name", str(train_path), "--dataset_format", "prompt-answer"], True


def heldout_accuracy(model_path: str, heldout_path: Path, max_new_tokens: int) -> dict[str, Any]:
    """Greedy accuracy of a saved model (or a Hub id) on the carved held-out rows (`offline.greedy_accuracy`)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data.adapters import string_prompt_to_conversational
    from ..data.offline import greedy_accuracy

    heldout = datasets.load_dataset("json", data_files=str(heldout_path), split="train")
    if isinstance(heldout[0]["prompt"], str):  # greedy_accuracy renders conversational prompts
        heldout = heldout.map(string_prompt_to_conversational)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    return greedy_accuracy(model, tokenizer, heldout, max_new_tokens=max_new_tokens)


class Trainer:
    """Runs one (method, seed) as `python -m trl_groupopt.cli train ...` and reads back its record."""

    def __init__(self, options: Options, run_args: list[str], score_here: bool) -> None:
        self.options, self.dir = options, Path(options.output_dir)
        self.run_args, self.score_here = run_args, score_here
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self._before: float | None = None

    def command(self, method: str, seed: int) -> list[str]:
        out = str(self.dir / "runs" / f"{method}-{seed}")
        return [sys.executable, "-m", "trl_groupopt.cli", "train", "--method", method, "--seed", str(seed),
                "--output_dir", out, "--heldout_eval_steps", "0", *self.run_args]  # fmt: skip

    def __call__(self, method: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
        folder = self.dir / "runs" / f"{method}-{seed}"
        shutil.rmtree(folder, ignore_errors=True)  # not a finished run (those are skipped): start it afresh
        log = folder.with_suffix(".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if self.options.workers > 1 else {})}
        started = time.perf_counter()
        with log.open("w") as handle:  # a session of its own: SIGTERM to the terminal's group leaves it running
            proc = subprocess.Popen(self.command(method, seed), stdout=handle, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
            with self.lock:
                self.live.add(proc)
            _, status, usage = os.wait4(proc.pid, 0)  # Ctrl-C meanwhile: `run` kills it (the run is lost)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
            with self.lock:
                self.live.discard(proc)
        wall, cpu = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
        if proc.returncode:
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["?"]
            raise RuntimeError(f"exit status {proc.returncode}; {log}: {tail[0][-300:]}")
        return self.record(method, seed, folder, wall, cpu)

    def record(self, method: str, seed: int, folder: Path, wall: float, cpu: float) -> dict[str, Any]:
        results = json.loads((folder / "results.json").read_text())
        before, after = results.get("accuracy_before"), results.get("accuracy_after")
        if self.score_here:
            heldout = self.dir / "data" / "heldout.jsonl"
            given, _ = _scan(self.run_args, "max_completion_length", "model_name_or_path")
            max_new = int(given["max_completion_length"] or 256)  # TRL's default
            with self.lock:  # the base model's, the same for every run: measured once
                if self._before is None:
                    from ..data.offline import EMBEDDED_POLICY_PATH

                    model = given["model_name_or_path"] or EMBEDDED_POLICY_PATH
                    self._before = heldout_accuracy(model, heldout, max_new)["accuracy"]
            before, after = self._before, heldout_accuracy(str(folder), heldout, max_new)["accuracy"]
        mechanisms = (results.get("mechanism") or {}).get("mechanisms") or []
        acted = {"what": "; ".join(m["acted_means"] for m in mechanisms), "steps": sum(m["steps"] for m in mechanisms),
                 "acted": sum(m["acted"] for m in mechanisms)} if mechanisms else None  # fmt: skip
        return {"method": method, "seed": seed, "accuracy_before": before, "accuracy_after": after,
                "heldout_examples": self.options.eval_examples, "steps": results.get("steps"), "acted": acted,
                "wall_s": wall, "cpu_s": cpu, "output_dir": str(folder)}  # fmt: skip

    def kill(self) -> None:
        """Ctrl-C: the runs in flight are stopped (and lost)."""
        with self.lock:
            for proc in self.live:
                proc.kill()


def comparisons(records: list[dict[str, Any]], methods: Sequence[str], baseline: str) -> list[dict[str, Any]]:
    """Each method against the baseline, paired by seed (`stats.compare_pair`) on the held-out accuracy after."""
    ok = [r for r in records if "error" not in r]

    def after(method: str) -> dict[int, float | None]:
        return {r["seed"]: r["accuracy_after"] for r in ok if r["method"] == method}

    out = []
    for method in (m for m in methods if m != baseline):
        acts = [r["acted"] for r in ok if r["method"] == method and r.get("acted")]
        steps, count = sum(a["steps"] for a in acts), sum(a["acted"] for a in acts)
        fraction = count / steps if steps else None
        acted = {"what": acts[0]["what"], "steps": steps, "acted": count, "fraction": fraction} if acts else None
        row = stats.compare_pair(after(method), after(baseline), acted=acted)
        d = row["difference"]
        out.append({"method": method, "baseline": baseline, "n": row["n"], "difference": d["mean"],
                    "ci95": [d["low"], d["high"]], "verdict": row["verdict"], "acted": acted,
                    "note": row["note"], "per_seed": row["per_seed"], "sd": d["std"], "power": row["power"]})  # fmt: skip
    return out


def payload(options: Options, runs: runfile.Runs) -> dict[str, Any]:
    """compare.json: the settings, every run of DIR and the comparisons."""
    ok = [r for r in runs.records if "error" not in r]
    return {
        "command": command_line(options),
        "settings": asdict(options),
        "verdict_rule": stats.VERDICT_RULE,
        "runs": runs.records,
        "comparisons": comparisons(runs.records, options.methods, options.baseline),
        "failed_runs": [f"{r['method']}-{r['seed']}" for r in runs.records if "error" in r],
        "run_wall_s": stats.mean_ci([r["wall_s"] for r in ok]),
        "run_cpu_s": stats.mean_ci([r["cpu_s"] for r in ok]),
        "wall_s": sum(i["wall_s"] for i in runs.invocations),
    }


def command_line(options: Options) -> str:
    return shlex.join(["trl-groupopt", "compare", "--methods", ",".join(options.methods), "--seeds",
                       str(options.seeds), "--output_dir", options.output_dir, "--baseline", options.baseline,
                       "--workers", str(options.workers), "--eval_examples", str(options.eval_examples),
                       *options.train_args])  # fmt: skip


def run(options: Options) -> dict[str, Any]:
    """Check `options` (`CompareError` before any run), run what DIR lacks, write the four files; returns
    compare.json's content."""
    check(options)
    out = Path(options.output_dir)
    grid = runfile.Grid(("method", "seed"), lambda *a: {}, describe)
    runs = runfile.read_runs(out / "runs.jsonl", grid)
    if conflict := runfile.settings_conflict(grid, runs, options.settings):
        raise CompareError(f"{conflict}: pass the train options those runs were made with, or another --output_dir.")
    trainer = Trainer(options, *carve_heldout(options, out / "data"))
    grid = replace(grid, run_one=trainer)
    jobs = runfile.pending(grid, runs, [(m, s) for s in range(options.seeds) for m in options.methods])
    total = len(options.methods) * options.seeds
    print(f"{PROG}: {total - len(jobs)} of {total} runs done in {out / 'runs.jsonl'}; {len(jobs)} to run "
          f"({options.workers} at a time)", flush=True)  # fmt: skip
    try:
        runfile.run_grid(grid, jobs, options.settings, out / "runs.jsonl", command_line(options),
                         workers=options.workers, pool="thread", on_record=lambda r: "error" in r)  # fmt: skip
    except KeyboardInterrupt:
        trainer.kill()
        raise
    result = payload(options, runfile.read_runs(out / "runs.jsonl", grid))
    (out / "compare.json").write_text(json.dumps(runfile.jsonable(result), indent=2) + "\n")
    (out / "compare.md").write_text(markdown(result))
    write_plot(result, out / "compare.png")
    return result


def compare(methods: Sequence[str] | str, seeds: int, output_dir: str | os.PathLike, *, baseline: str = "grpo",
            workers: int = 1, eval_examples: int = DEFAULT_EVAL_EXAMPLES, train_args: Sequence[str] = (),
            **train_options: Any) -> dict[str, Any]:  # fmt: skip
    """The Python twin of `trl-groupopt compare`: `train_options` are train options by name (`max_steps=3`),
    `train_args` the same as command-line words. Returns compare.json's content."""
    words = list(train_args)
    for name, value in train_options.items():
        words += [f"--{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    methods = methods.split(",") if isinstance(methods, str) else list(methods)
    return run(Options(list(methods), seeds, str(output_dir), baseline, workers, eval_examples, words))


def main(argv: Sequence[str] | None = None) -> int:
    """`trl-groupopt compare ...`: 0 when every run finished, 1 when one failed (the comparison stops at it), 2 for
    bad input (one line), 143 when SIGTERM stopped it."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        result = run(options)
    except CompareError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    for row in result["comparisons"]:
        print(f"{row['method']} vs {row['baseline']}: {row['verdict']} ({row['n']} seeds)")
    print(f"wrote {Path(options.output_dir) / 'compare.md'} (and runs.jsonl, compare.json, compare.png)")
    done = {(r["method"], r["seed"]) for r in result["runs"] if "error" not in r}
    if result["failed_runs"]:
        return 1
    return 0 if len(done) == len(options.methods) * options.seeds else 143


if __name__ == "__main__":
    sys.exit(main())
