"""`trl-groupopt compare`: does a method beat the baseline on your model and task? Paired seeds, 95% intervals.

Each (method, seed) is one `train` run in DIR/runs/M-S, scored on a held-out split they share, run here on the free
devices (`local.py`) or as a Slurm job (`slurm.py`); `--seeds auto` plans the seeds from a pilot (`seeds.py`). See
docs/compare.md."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import local, slurm, stats
from . import runs as runfile
from . import seeds as seedplan
from .argv import scan
from .options import PROG, CompareError, Options, check, command_line, parse_options
from .report import describe, markdown, write_plot
from .trainrun import RunSpec

__all__ = ["CompareError", "Options", "check", "compare", "main", "parse_options", "run"]

#: Options naming the user's data: replaced, for the runs, by the training part of the carved split.
DATA_OPTIONS = ("dataset_name", "dataset_config", "dataset_format", "dataset_train_split")
CARVE_SEED = 0  # the held-out rows of a user's dataset: the first --eval_examples of a shuffle with this seed
#: DIR/launcher.json: how DIR's runs are launched (another launcher would not know the first one's jobs)
LAUNCHER_FILE = "launcher.json"


def carve_heldout(options: Options, data_dir: Path) -> tuple[list[str], bool]:
    """(every run's train options, whether compare scores DATA/heldout.jsonl itself): the held-out split every run
    shares, carved once from `--dataset_name` (`CARVE_SEED`; the rest in DATA/train.jsonl). See docs/compare.md."""
    from ..data.offline import make_arithmetic_dataset, uses_embedded_policy

    given, rest = scan(options.train_args, *DATA_OPTIONS)
    name, heldout_path, train_path = given["dataset_name"], data_dir / "heldout.jsonl", data_dir / "train.jsonl"
    if name is None:
        if uses_embedded_policy(scan(options.train_args, "model_name_or_path")[0]["model_name_or_path"]):
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


def comparisons(records: list[dict[str, Any]], methods: Sequence[str], baseline: str,
                seed_plan: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each method against the baseline, paired by seed (`stats.compare_pair`) on the held-out accuracy after; with
    a `--seeds auto` plan, over its seeds with Stein's interval (`seedplan.RULE`)."""
    ok = [r for r in records if "error" not in r]
    if seed_plan is not None:
        ok = [r for r in ok if r["seed"] < seed_plan["total"]]

    def after(method: str) -> dict[int, float | None]:
        return {r["seed"]: r["accuracy_after"] for r in ok if r["method"] == method}

    out = []
    for method in (m for m in methods if m != baseline):
        acts = [r["acted"] for r in ok if r["method"] == method and r.get("acted")]
        steps, count = sum(a["steps"] for a in acts), sum(a["acted"] for a in acts)
        fraction = count / steps if steps else None
        acted = {"what": acts[0]["what"], "steps": steps, "acted": count, "fraction": fraction} if acts else None
        pilot = None
        if seed_plan is not None and (row := seed_plan["methods"][method])["pilot_sd"] is not None:
            pilot = (row["pilot_n"], row["pilot_sd"])
        row = stats.compare_pair(after(method), after(baseline), acted=acted, pilot=pilot)
        d = row["difference"]
        out.append({"method": method, "baseline": baseline, "n": row["n"], "difference": d["mean"],
                    "ci95": [d["low"], d["high"]], "verdict": row["verdict"], "acted": acted,
                    "note": row["note"], "per_seed": row["per_seed"], "sd": d["std"], "power": row["power"],
                    "interval": "stein" if pilot else "t"})  # fmt: skip
    return out


def payload(options: Options, runs: runfile.Runs, seed_plan: dict[str, Any] | None,
            launcher: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """compare.json: the settings, every run of DIR and the comparisons."""
    ok = [r for r in runs.records if "error" not in r]
    settings = {k: v for k, v in asdict(options).items() if k not in ("secrets", "cancel")}
    return {
        "command": command_line(options),
        "settings": settings,
        "launcher": launcher,
        "verdict_rule": stats.VERDICT_RULE,
        "seed_plan": seed_plan,
        "runs": runs.records,
        "comparisons": comparisons(runs.records, options.methods, options.baseline, seed_plan),
        "failed_runs": [f"{r['method']}-{r['seed']}" for r in runs.records if "error" in r],
        "run_wall_s": stats.mean_ci([r["wall_s"] for r in ok]),
        "run_cpu_s": stats.mean_ci([r["cpu_s"] for r in ok]),
        "wall_s": sum(i["wall_s"] for i in runs.invocations),
    }


def _launcher_record(options: Options, placement: local.Placement | None) -> dict[str, Any]:
    """DIR/launcher.json's content: the launcher, and the GPUs each run trains on (0: the CPU), a setting of the runs
    (one training process per GPU)."""
    if options.launcher == "slurm":
        return {"launcher": "slurm", "gpus_per_run": options.slurm.gpus_per_run}
    return {"launcher": "local", "gpus_per_run": 0 if placement is None or placement.on_cpu else placement.per_run}


def _check_folder(options: Options, out: Path, launcher: dict[str, Any]) -> runfile.Grid:
    """Refuse a comparison folder made with other settings or another launcher."""
    grid = runfile.Grid(("method", "seed"), None, describe)
    runs = runfile.read_runs(out / "runs.jsonl", grid)
    if conflict := runfile.settings_conflict(grid, runs, options.settings):
        raise CompareError(f"{conflict}: pass the train options those runs were made with, or another --output_dir.")
    path = out / LAUNCHER_FILE
    made = json.loads(path.read_text()) if path.exists() else None
    if made is not None and made != launcher:
        differ = ", ".join(f"{k} {made.get(k)!r} there, {launcher.get(k)!r} here" for k in sorted(set(made) | set(
            launcher)) if made.get(k) != launcher.get(k))  # fmt: skip
        raise CompareError(f"{path}: {out} was run otherwise ({differ}): pass --launcher {made.get('launcher')} with "
                           "the GPUs per run it had, or another --output_dir.")  # fmt: skip
    return grid


def run(options: Options) -> dict[str, Any]:
    """Check `options` (`CompareError` before any run or job), run what DIR lacks, write the four files; returns
    compare.json's content."""
    placement = check(options)
    out = Path(options.output_dir)
    launcher = _launcher_record(options, placement)
    grid = _check_folder(options, out, launcher)
    run_args, score_here = carve_heldout(options, out / "data")  # once, before anything runs or is submitted
    one_thread = placement is not None and placement.on_cpu and placement.concurrency > 1
    spec = RunSpec(
        str(out), tuple(run_args), score_here, options.eval_examples, max(1, launcher["gpus_per_run"]), one_thread
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / LAUNCHER_FILE).write_text(json.dumps(launcher) + "\n")
    command = command_line(options)
    if options.launcher == "slurm":
        launch = slurm.SlurmLauncher(spec, options.slurm, options.secrets, options.settings, command).run
    else:

        def launch(keys: list[tuple]) -> None:
            jobs = runfile.pending(grid, runfile.read_runs(out / "runs.jsonl", grid), keys)
            done = len(keys) - len(jobs)
            print(f"{PROG}: {done} of {len(keys)} runs done in {out / 'runs.jsonl'}; {len(jobs)} to run "
                  f"({placement.concurrency} at a time{_where(placement)})", flush=True)  # fmt: skip
            local.run_local(spec, placement, options.secrets, jobs, options.settings, command)

    def records() -> list[dict[str, Any]]:
        return runfile.read_runs(out / "runs.jsonl", grid).records

    seed_plan = seedplan.drive(options.methods, options.seeds, options.baseline, options.pilot_seeds,
                            options.max_seeds, launch, records)  # fmt: skip
    result = payload(options, runfile.read_runs(out / "runs.jsonl", grid), seed_plan, launcher)
    (out / "compare.json").write_text(json.dumps(runfile.jsonable(result), indent=2) + "\n")
    (out / "compare.md").write_text(markdown(result))
    write_plot(result, out / "compare.png")
    return result


def _where(placement: local.Placement) -> str:
    cpu = " (on the CPU)" if placement.on_cpu else ""
    if not placement.devices:
        return ", on the CPU"
    return f", each on {placement.per_run} of devices {','.join(placement.devices)}{cpu}"


def compare(methods: Sequence[str] | str, seeds: int | str, output_dir: str | os.PathLike, *,
            train_args: Sequence[str] = (), **options: Any) -> dict[str, Any]:  # fmt: skip
    """The Python twin of `trl-groupopt compare`: `options` are its options by name (`baseline="grpo"`, `workers=2`,
    `launcher="slurm"`, `slurm_time="2:00:00"`, `devices=[0, 1]`, ...) and train options by name (`max_steps=3`),
    `train_args` train options as command-line words. Returns compare.json's content."""
    names = ",".join(methods.split(",") if isinstance(methods, str) else methods)
    words = ["--methods", names, "--seeds", str(seeds), "--output_dir", str(output_dir)]
    for name, value in options.items():
        if name == "cancel":
            words += ["--cancel"] if value else []
            continue
        for item in value if name == "slurm_setup" else [value]:
            if isinstance(item, (list, tuple)):
                item = ",".join(str(v) for v in item)
            words += [f"--{name}", str(item).lower() if isinstance(item, bool) else str(item)]
    return run(parse_options([*words, *train_args]))


def main(argv: Sequence[str] | None = None) -> int:
    """`trl-groupopt compare ...`: 0 when every run finished, 1 when one failed (locally the comparison stops at it),
    2 for bad input (one line), 143 when a signal stopped it (Slurm jobs run on: the same command re-attaches)."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        if options.cancel:
            return _cancel(options)
        result = run(options)
    except CompareError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except slurm.SubmitError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    for row in result["comparisons"]:
        print(f"{row['method']} vs {row['baseline']}: {row['verdict']} ({row['n']} seeds)")
    print(f"wrote {Path(options.output_dir) / 'compare.md'} (and runs.jsonl, compare.json, compare.png)")
    wanted = options.seeds if result["seed_plan"] is None else result["seed_plan"]["total"]
    done = {(r["method"], r["seed"]) for r in result["runs"] if "error" not in r}
    if not isinstance(wanted, int):  # --seeds auto, its pilot unfinished
        wanted = options.pilot_seeds
    missing = [(m, s) for m in options.methods for s in range(wanted) if (m, s) not in done]
    if not missing:
        return 0
    return 1 if any(f"{m}-{s}" in result["failed_runs"] for m, s in missing) else 143


def _cancel(options: Options) -> int:
    launcher = Path(options.output_dir) / LAUNCHER_FILE
    if not launcher.exists() or json.loads(launcher.read_text()).get("launcher") != "slurm":
        raise CompareError(f"--cancel: {options.output_dir} has no Slurm jobs ({launcher}); nothing to cancel.")
    if problem := slurm.check_commands():
        raise CompareError(problem)
    ids = slurm.cancel(options.output_dir)
    print(f"{PROG}: cancelled {len(ids)} job(s){': ' + ' '.join(ids) if ids else ''}; the same command without "
          "--cancel submits them again")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
