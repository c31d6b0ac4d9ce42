"""The one runner of the training benchmarks: the stress grid, the claims grid (`--claims`) and sample efficiency
(`--sample-efficiency`), `GRIDS`. A run trains a configuration (`CONFIGS`, `SE_CONFIGS`) with its regime's knob
(`REGIMES`) through the library's runner (`trl_groupopt.comparison.runs`: keyed runs files that the same command resumes);
`--from-runs FILE` rebuilds the JSON and the plot without training. See benchmarks/README.md.

    python -m benchmarks.stress --claims --from-runs benchmarks/results/claims_runs.jsonl  # rebuild, no training
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from pathlib import Path
from typing import Any

from trl_groupopt.comparison.runs import Runs, pending, read_runs, run_grid, settings_conflict

from . import common
from .stress_grid import (
    CLAIM_SEEDS,
    CLAIM_VERDICTS,
    CLAIMS,
    CONFIGS,
    DEFAULTS,
    GRID_REGIMES,
    GRIDS,
    GSPO,
    MECHANISM_METRICS,
    MECHANISM_PREFIXES,
    PILOT_SEEDS,
    PROBE_SEEDS,
    PROBES,
    REGIMES,
    RUNNING,
    SE_CONFIGS,
    SMOKE,
    SMOKE_CLAIMS,
    SMOKE_PROBE,
    STAGE_RULE,
    TRL,
    VARIANTS,
    VERDICT_RULE,
    Config,
    config_of,
    kind_of,
)
from .stress_run import GRID, record_extremes, regime_task, run_one, run_settings
from .stress_summary import (
    cell_runs,
    claim_row,
    claims_table,
    mechanism_acted,
    outcome_of,
    probe_cells,
    probe_table,
    stage2_cells,
    summarise,
)

#: The public names: the grid driver's and CLI's here, the rest from the modules they live in (`stress_grid`,
#: `stress_run`, `stress_summary`), kept importable from `benchmarks.stress` for its callers.
__all__ = [
    "CLAIMS", "CLAIM_SEEDS", "CLAIM_VERDICTS", "CONFIGS", "DEFAULTS", "GRID", "GRIDS", "GRID_REGIMES", "GSPO",
    "MECHANISM_METRICS", "MECHANISM_PREFIXES", "PILOT_SEEDS", "PROBES", "PROBE_SEEDS", "REGIMES", "RUNNING",
    "SE_CONFIGS", "SMOKE", "SMOKE_CLAIMS", "SMOKE_PROBE", "STAGE_RULE", "TRL", "VARIANTS", "VERDICT_RULE", "Config",
    "build_payload", "cell_runs", "cells_of", "claim_row", "claims_table", "collect", "config_of", "jobs_of",
    "kind_of", "main", "mechanism_acted", "outcome_of", "parse_args", "plot", "probe_cells", "probe_table",
    "provenance", "record_extremes", "regime_task", "run_one", "run_settings", "selected", "stage2_cells",
    "summarise",
]  # fmt: skip


# ------------------------------------------------------------------------------------------------ the grids
def cells_of(args: argparse.Namespace) -> dict[tuple, int]:
    """The cells the flags select: (regime, value, configuration) -> seeds. The claims grid: each claim's
    configuration and baseline with its stage-1 seeds, and every probe cell (not with `--claim-ids`)."""
    cells: dict[tuple, int] = {}

    def add(regime: str, value: int, config: str, seeds: int) -> None:  # a cell two claims share: the larger plan
        cells[(regime, value, config)] = max(cells.get((regime, value, config), 0), seeds)

    for regime in args.regime_list if args.grid != "claims" else ():
        values, configs = args.smoke_cells.get(regime) or (REGIMES[regime]["values"], REGIMES[regime]["configs"])
        for value, config in ((v, c) for v in values for c in configs):
            add(regime, value, config, args.seeds)
    chosen = [c for c in args.claim_list or CLAIM_SEEDS if not args.smoke or c in SMOKE_CLAIMS]
    for claim in (c for c in CLAIMS if args.grid == "claims" and c["id"] in chosen):
        for config in (c for c in (claim["config"], claim["baseline"]) if c):
            add(claim["regime"], claim["value"], config, 1 if args.smoke else CLAIM_SEEDS[claim["id"]][0])
    if args.grid == "claims" and args.claim_list is None:  # the probe
        smoke = [(*SMOKE_PROBE, c, 1) for c in REGIMES[SMOKE_PROBE[0]]["configs"]]
        for cell in smoke if args.smoke else probe_cells():
            add(*cell)
    return {key: n for key, n in cells.items() if selected(args, key)}


def selected(args: argparse.Namespace, key: tuple) -> bool:
    """Whether `--regimes` and `--configs` select this (regime, value, configuration) cell."""
    return key[0] in args.regime_list and (not args.configs or key[2] in args.configs.split(","))


def jobs_of(cells: dict[tuple, int]) -> list[tuple]:
    """Every (regime, value, configuration, seed), most expensive first (long completions, large groups, most updates
    per rollout, N = 16: the pool ends together), and seed by seed within a cost class (a stopped grid leaves
    configurations and baselines paired)."""

    def cost(job: tuple) -> tuple:
        size = config_of(job[0], job[2]).overrides.get("num_generations", 0)
        return kind_of(job[0]) != "long", kind_of(job[0]) != "group_size", -size, -job[1], job[3]

    return sorted(((*key, seed) for key, n in cells.items() for seed in range(n)), key=cost)


def collect(args: argparse.Namespace, jobs: list[tuple], settings: dict[str, Any], path: Path, command: str) -> Runs:
    """The runs to summarise: `--from-runs` as it is; else `path` after running the jobs whose keys it lacks (all of
    them with `--fresh`). Runs made with other settings are refused, never mixed."""
    if not args.from_runs and args.fresh and path.exists():
        path.unlink()
    runs = read_runs(args.from_runs or path, GRID)
    if not args.from_runs and any("settings" not in r for r in runs.records):
        raise SystemExit(f"{path} holds runs written without their settings (before runs files were keyed): pass "
                         "--fresh to run the grid again, or --output-dir for a new runs file (--from-runs rebuilds "
                         "the summary from this one).")  # fmt: skip
    conflict = settings_conflict(GRID, runs, settings)
    if conflict:
        raise SystemExit(f"{conflict}. Pass the flags it was made with, or --output-dir for a new runs file, or "
                         "--fresh to discard its runs.")  # fmt: skip
    if not args.from_runs:
        todo = pending(GRID, runs, jobs)
        print(f"{len(todo)} of {len(jobs)} run(s) to do, {args.workers} worker(s)", flush=True)
        run_grid(GRID, todo, settings, path, command, workers=args.workers)
        runs = read_runs(path, GRID)
    return runs


def provenance(runs: Runs, command: str, workers: int) -> dict[str, Any]:
    """What made the runs: the invocations' commands, workers and total wall time; a runs file written before
    invocation records takes them from the summary JSON written beside it, else from this command."""
    beside = runs.path.with_name(runs.path.name.replace("_runs.jsonl", ".json"))
    if runs.invocations:
        return {"command": " ; ".join(dict.fromkeys(i["command"] for i in runs.invocations)),
                "workers": max(i["workers"] for i in runs.invocations),
                "wall_s": sum(i["wall_s"] for i in runs.invocations), "invocations": runs.invocations}  # fmt: skip
    if beside.exists() and beside != runs.path:
        old = json.loads(beside.read_text())
        return {"command": old["command"], "workers": old["settings"]["workers"], "wall_s": old["wall_s"]}
    return {"command": command, "workers": workers, "wall_s": sum(r.get("wall_s") or 0.0 for r in runs.records)}


def build_payload(args: argparse.Namespace, runs: Runs, cells: dict[tuple, int], settings: dict[str, Any],
                  command: str) -> dict[str, Any]:  # fmt: skip
    """stress.json, claims.json or sample_efficiency.json: the settings, the summary (and the claims and probe
    tables), the failed runs and where the runs came from."""
    made, records = provenance(runs, command, args.workers), runs.records
    device = next((r["device_info"] for r in records if "device_info" in r), None)
    payload: dict[str, Any] = {
        "benchmark": args.grid, "device": device or common.describe_device(settings["device"]),
        "command": made["command"], "smoke": args.smoke,
        "settings": {"seeds": args.seeds, **settings, "workers": made["workers"], "regimes": sorted({r for r, _, _ in
                     cells}), "configs": {c: config_of(r, c)._asdict() for r, _, c in cells}},
        "ci_definition": "mean ± t_{0.975, n-1} * s / sqrt(n) over seeds (Student t, sample std)",
        "summary": summarise(records),
    }  # fmt: skip
    if args.grid == "sample_efficiency":
        example = run_settings("sample_efficiency", 4, "grpo", 0, settings, "<tmp>")
        payload["settings"]["shared_config"] = {k: v for k, v in example.items() if k not in ("output_dir", "seed")}
        payload["jitter2_definition"] = " ".join(common.jitter2.__doc__.split())
    if args.grid == "claims":
        payload["settings"].update(seeds=None, claim_seeds=CLAIM_SEEDS, pilot_seeds=PILOT_SEEDS,
                                   probe_seeds=PROBE_SEEDS)  # fmt: skip
        payload.update(verdict_rule=VERDICT_RULE, stage_rule=STAGE_RULE, claims=claims_table(records),
                       probe=probe_table(records))  # fmt: skip
    payload.update(failed_runs=[{**dict(zip(GRID.key_fields, GRID.key(r))), "error": r["error"][-2000:]}
                                for r in records if "error" in r], runs_total=len(records),
                   run_wall_s=common.mean_ci([r.get("wall_s") for r in records]), wall_s=made["wall_s"])  # fmt: skip
    return payload | ({"invocations": made["invocations"]} if "invocations" in made else {})


def plot(payload: dict[str, Any], path: Path) -> Path | None:
    """Per regime of the stress grid, final held-out accuracy against the knob per configuration (mean, 95% CI);
    sample efficiency: each configuration's held-out accuracy over training (mean, 95% band)."""
    plt, summary = common.pyplot(), payload["summary"]
    regimes = [r for r in [*GRID_REGIMES, "sample_efficiency"] if r in summary]
    if plt is None or not regimes:
        return None
    fig, axes = plt.subplots(1, len(regimes), figsize=(5.5 * len(regimes) + 2, 4.8), squeeze=False)
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate({**CONFIGS, **SE_CONFIGS})}
    for ax, regime in zip(axes[0], regimes):
        values = sorted(summary[regime], key=float)
        if regime == "sample_efficiency":
            for name, e in summary[regime][values[0]].items():
                curve = common.mean_curve(e["accuracy_curves"])
                ax.plot(curve["steps"], curve["mean"], color=colors[name], label=f"{name} (n={len(e['seeds'])})")
                ax.fill_between(curve["steps"], curve["low"], curve["high"], color=colors[name], alpha=0.15)
            ax.set(title="held-out greedy accuracy (mean, 95% CI over seeds)", xlabel="optimizer step")
        for i, name in enumerate(c for c in CONFIGS if regime != "sample_efficiency" and any(
                c in summary[regime][v] for v in values)):  # fmt: skip
            points = [(j + i * 0.04, summary[regime][v][name]["final_accuracy"]) for j, v in enumerate(values)
                      if name in summary[regime][v]]  # fmt: skip
            ax.errorbar([x for x, _ in points], [p["mean"] for _, p in points], [p["ci95"] or 0 for _, p in points],
                        marker="o", capsize=2, label=name, color=colors[name])  # fmt: skip
            ax.set(title=f"{regime}: final held-out accuracy (mean, 95% CI)", xticks=range(len(values)),
                   xticklabels=values, xlabel=textwrap.fill(REGIMES[regime]["knob"], 70))  # fmt: skip
        ax.legend(fontsize=6, ncol=2)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{payload['benchmark']}, embedded tiny policies ({payload['device']['description']})", fontsize=10)
    return common.save_figure(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add, mode = parser.add_argument, parser.add_mutually_exclusive_group()
    mode.add_argument("--claims", dest="grid", action="store_const", const="claims", default="stress",
                      help="The claims grid: each claim's cells with its planned seeds (stage 2 included) and "
                      "ECHO's probe, at 64 steps and 200 held-out prompts.")  # fmt: skip
    mode.add_argument("--sample-efficiency", dest="grid", action="store_const", const="sample_efficiency",
                      help="Every method in one mild regime: accuracy curves, 100 steps, 3 seeds.")  # fmt: skip
    add("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    add("--smoke", action="store_true", help="A few cells, 1 seed, 2 steps, a small task: seconds.")
    add("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="cpu: one core per run is the fastest.")
    add("--regimes", help="Comma-separated subset of " + ", ".join(REGIMES) + " (default: the grid's).")
    add("--configs", help="Comma-separated subset of configurations (default: each regime's).")
    add("--claim-ids", help="With --claims: only these claims' cells (with their seeds), no probe cell.")
    add("--seeds", type=int, help="Seeds per configuration: 0..seeds-1 (`GRIDS`; claims: `CLAIM_SEEDS`).")
    add("--max-steps", type=int, help="Optimizer steps per run, the same for all (default: `GRIDS`).")
    add("--long-learning-rate", type=float, help="The long regime's learning rate (1e-5: the long-chain policy "
        "degrades at the demo's 1e-4).")  # fmt: skip
    add("--workers", type=int, default=1, help="Parallel runs (processes, one torch thread each).")
    add("--fresh", action="store_true", help="Discard the runs file's records and run the whole grid again.")
    add("--from-runs", type=Path, help="Skip training: summarise, tabulate and plot this runs JSONL file.")
    args = parser.parse_args(argv)
    grid = GRIDS[args.grid]
    args.claim_list = args.claim_ids.split(",") if args.claim_ids else None
    if args.claim_list and (args.grid != "claims" or not set(args.claim_list) <= set(CLAIM_SEEDS)):
        parser.error(f"--claim-ids takes --claims and ids of {list(CLAIM_SEEDS)} (got {args.claim_ids!r})")
    args.regime_list = args.regimes.split(",") if args.regimes else grid["regimes"]
    if not set(args.regime_list) <= set(REGIMES):
        parser.error(f"unknown regime(s) in {args.regimes!r}; choose from {list(REGIMES)}")
    args.seeds = 1 if args.smoke else args.seeds or grid["seeds"]
    args.smoke_cells = grid.get("smoke", {}) if args.smoke else {}
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    common.setup_environment()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the spawned workers: one thread each, as in this process
    settings = {"device": common.resolve_device(args.device), **GRIDS[args.grid]["settings"]}
    flags = dict(max_steps=args.max_steps, long_learning_rate=args.long_learning_rate) | (SMOKE if args.smoke else {})
    settings.update({k: v for k, v in flags.items() if k in settings and v is not None})
    stem = args.grid + ("_smoke" if args.smoke else "")
    runs_path, command = args.output_dir / f"{stem}_runs.jsonl", common.command_line("benchmarks.stress", argv)
    cells = cells_of(args)
    runs = collect(args, jobs_of(cells), settings, runs_path, command)
    if args.grid == "claims" and not args.from_runs and not args.smoke:  # stage 2, in the same invocation
        rows = [row for row in claims_table(runs.records) if args.claim_list is None or row["id"] in args.claim_list]
        more = {k: n for k, n in stage2_cells(rows).items() if selected(args, k) and n > cells.get(k, 0)}
        if more:
            cells.update(more)
            args.fresh = False  # stage 1's runs stay
            runs = collect(args, jobs_of(cells), settings, runs_path, command)
    payload = build_payload(args, runs, cells, settings, command)
    written = [common.write_json(args.output_dir / f"{stem}.json", payload), plot(payload,
               args.output_dir / f"{stem}.png"), None if args.from_runs else runs_path]  # fmt: skip
    if payload["failed_runs"]:
        print(f"{len(payload['failed_runs'])} run(s) failed: see failed_runs in the JSON")
    print(f"wrote {', '.join(str(p) for p in written if p)}; {len(runs.records)} run(s), "
          f"{payload['wall_s'] / 60:.1f} min of wall time in all", flush=True)  # fmt: skip
    return payload


if __name__ == "__main__":
    main()
