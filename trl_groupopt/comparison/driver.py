"""`trl-groupopt compare`: does a method beat the baseline on your model and task? Paired seeds, intervals that hold together at 95%.

Each (method, seed) is one `train` run in DIR/runs/M-S, scored on a held-out split they share, each a job of its own
(training and scoring alike) handed to submitit's LocalExecutor on the free devices here (`local.py`) or to its
SlurmExecutor (`slurm.py`): this driver only hands out jobs and collects records, and never loads a model.
`--seeds auto` plans the seeds from a pilot (`seeds.py`). See docs/compare.md."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import local, slurm, stats, trainrun
from . import runs as runfile
from . import seeds as seedplan
from .options import PROG, CompareError, Options, check, command_line, other_settings, parse_options
from .report import describe, markdown, write_plot
from .split import carve_heldout
from .trainrun import RunSpec

__all__ = ["CompareError", "Options", "check", "compare", "main", "parse_options", "run"]

#: DIR/launcher.json: how DIR's runs are launched (another launcher would not know the first one's jobs)
LAUNCHER_FILE = "launcher.json"
#: DIR/runs.jsonl's records: a run's, or why a line is not one (skipped, with a warning)
GRID = runfile.Grid(("method", "seed"), None, describe, trainrun.record_problem)


def comparisons(records: list[dict[str, Any]], methods: Sequence[str], baseline: str,
                seed_plan: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each method against the baseline, paired by seed (`stats.compare_pair`) on the held-out accuracy after; with
    a `--seeds auto` plan, over its seeds with Stein's interval (`seedplan.RULE`)."""
    ok = [r for r in records if "error" not in r]
    if seed_plan is not None:
        ok = [r for r in ok if r["seed"] < seed_plan["total"]]

    def after(method: str) -> dict[int, float | None]:
        return {r["seed"]: r["accuracy_after"] for r in ok if r["method"] == method}

    out, family = [], seedplan.family(methods, baseline)
    for method in (m for m in methods if m != baseline):
        acts = [r["acted"] for r in ok if r["method"] == method and r.get("acted")]
        steps, count = sum(a["steps"] for a in acts), sum(a["acted"] for a in acts)
        undefined = sum(a.get("undefined") or 0 for a in acts)  # steps its metric was undefined on: not counted
        acted = {"what": acts[0].get("what", ""), "steps": steps, "acted": count, "fraction": count / steps if steps
                 else None, "undefined": undefined} if acts else None  # fmt: skip
        pilot = None
        if seed_plan is not None and (row := seed_plan["methods"][method])["pilot_sd"] is not None:
            pilot = (row["pilot_n"], row.get("planned_sd") or row["pilot_sd"])  # the floored sd it was planned from
        row = stats.compare_pair(after(method), after(baseline), acted=acted, pilot=pilot, family=family)
        d = row["difference"]
        out.append({"method": method, "baseline": baseline, "n": row["n"], "difference": d["mean"],
                    "ci95": [d["low"], d["high"]], "level": 1 - d["alpha"], "verdict": row["verdict"],
                    "procedure": d["procedure"], "p_value": row["p_value"], "p_adjusted": row["p_adjusted"],
                    "correction": row["correction"], "family": family, "acted": acted, "note": row["note"],
                    "per_seed": row["per_seed"], "sd": d["std"], "power": row["power"],
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


def _check_folder(options: Options, out: Path, launcher: dict[str, Any]) -> runfile.Runs:
    """DIR's runs, its damaged lines warned about once; refuse a folder made with other settings or another
    launcher."""
    runs = runfile.read_runs(out / "runs.jsonl", GRID)
    for warning in runs.skipped:
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    for record in runs.records:
        if "settings" in record and (differ := other_settings(record["settings"], options.settings)):
            raise CompareError(f"{runs.path}: the run {GRID.tag(record)} was made with other settings ({differ}): "
                               "pass the train options those runs were made with, or another --output_dir.")  # fmt: skip
    path = out / LAUNCHER_FILE
    values, _ = runfile.read_lines(path)
    made = values[0][1] if values else None
    if path.exists() and not isinstance(made, dict):
        raise CompareError(f"{path} is damaged: delete it if {out}'s runs were made with these launcher options "
                           "(this command writes it again), or use another --output_dir.")  # fmt: skip
    if made is not None and made != launcher:
        differ = ", ".join(f"{k} {made.get(k)!r} there, {launcher.get(k)!r} here" for k in sorted(set(made) | set(
            launcher)) if made.get(k) != launcher.get(k))  # fmt: skip
        raise CompareError(f"{path}: {out} was run otherwise ({differ}): pass --launcher {made.get('launcher')} with "
                           "the GPUs per run it had, or another --output_dir.")  # fmt: skip
    return runs


def run(options: Options) -> dict[str, Any]:
    """Check `options` (`CompareError` before any run or job), run what DIR lacks, write the four files; returns
    compare.json's content."""
    placement = check(options)
    out = Path(options.output_dir)
    launcher = _launcher_record(options, placement)
    made = _check_folder(options, out, launcher)
    if problem := seedplan.check_recorded(out, options.seeds, options.pilot_seeds, options.max_seeds):
        raise CompareError(problem)
    # once, before anything runs or is submitted
    run_args, score_here = carve_heldout(options, out / "data", bool(made.records))
    one_thread = placement is not None and placement.on_cpu and placement.concurrency > 1
    spec = RunSpec(
        str(out), tuple(run_args), score_here, options.eval_examples, max(1, launcher["gpus_per_run"]), one_thread
    )
    out.mkdir(parents=True, exist_ok=True)
    runfile.write_json(out / LAUNCHER_FILE, launcher)
    seedplan.record(out, options.seeds, options.pilot_seeds, options.max_seeds)
    command = command_line(options)
    if options.launcher == "slurm":
        launch = slurm.SlurmLauncher(spec, options.slurm, options.secrets, options.settings, command).run
    else:

        def launch(keys: list[tuple]) -> None:
            jobs = runfile.pending(GRID, runfile.read_runs(out / "runs.jsonl", GRID), keys)
            done = len(keys) - len(jobs)
            print(f"{PROG}: {done} of {len(keys)} runs done in {out / 'runs.jsonl'}; {len(jobs)} to run "
                  f"({placement.concurrency} at a time{_where(placement)})", flush=True)  # fmt: skip
            local.run_local(spec, placement, options.secrets, jobs, options.settings, command)

    def records() -> list[dict[str, Any]]:
        return runfile.read_runs(out / "runs.jsonl", GRID).records

    seed_plan = seedplan.drive(options.methods, options.seeds, options.baseline, options.pilot_seeds,
                            options.max_seeds, launch, records)  # fmt: skip
    result = payload(options, runfile.read_runs(out / "runs.jsonl", GRID), seed_plan, launcher)
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
    2 for bad input (one line), 143 when a signal stopped it (Slurm jobs run on: the same command re-attaches), 130
    on Ctrl-C (one line: what was kept, the command that resumes)."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    runs_file = Path(options.output_dir or ".") / "runs.jsonl"
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
    except KeyboardInterrupt:
        kept = [r for r in runfile.read_runs(runs_file, GRID).records if "error" not in r and r["method"] in
                options.methods]  # fmt: skip
        flight = (
            "submitted jobs run on" if options.launcher == "slurm" else "a run in flight was stopped and trains again"
        )
        print(f"{PROG}: interrupted: {len(kept)} finished run(s) kept in {runs_file} ({flight}); resume with: "
              f"{command_line(options)}", file=sys.stderr, flush=True)  # fmt: skip
        return 130
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        print(
            f"{PROG}: error: the disk is full (No space left on device: {error.filename or runs_file}): free "
            f"space and run the same command again (the finished runs are kept in {runs_file})",
            file=sys.stderr,
        )
        return 1
    for row in result["comparisons"]:
        print(f"{row['method']} vs {row['baseline']}: {row['verdict']} ({row['n']} seeds; {row['level']:.1%} interval "
              f"by {row['procedure']}, {row['correction']} over {row['family']})")  # fmt: skip
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
    values, _ = runfile.read_lines(launcher)
    if not values or not isinstance(values[0][1], dict) or values[0][1].get("launcher") != "slurm":
        raise CompareError(f"--cancel: {options.output_dir} has no Slurm jobs ({launcher}); nothing to cancel.")
    if problem := slurm.check_commands():
        raise CompareError(problem)
    ids = slurm.cancel(options.output_dir)
    print(f"{PROG}: cancelled {len(ids)} job(s){': ' + ' '.join(ids) if ids else ''}; the same command without "
          "--cancel submits them again")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
