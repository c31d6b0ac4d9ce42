"""The training benchmarks' summaries: each run's outcomes (`outcome_of`), whether a method's mechanism acted, the
per-cell means and intervals (`summarise`), the probe table and each claim's verdict (`claims_table`, with the cells
its second stage adds)."""

from __future__ import annotations

import math
from typing import Any

from trl_groupopt import METHODS
from trl_groupopt.comparison import stats

from . import common
from .stress_grid import (
    CLAIM_SEEDS,
    CLAIM_VERDICTS,
    CLAIMS,
    CONFIGS,
    MECHANISM_METRICS,
    PROBE_SEEDS,
    PROBES,
    REGIMES,
    RUNNING,
    config_of,
)


# ------------------------------------------------------------------------------------------------ outcomes
def outcome_of(run: dict[str, Any], outcome: str) -> float | None:
    """A run's scalar outcome: "final_accuracy", "accuracy_gain", "mean_reward", "mechanism:<key>" (mean over
    training), or "log_ratio:<a>:<b>" (mean over the logged steps of log(a / b): < 0 when a is smaller)."""
    if outcome in ("final_accuracy", "accuracy_gain"):
        return run["final_accuracy"] - (run["initial_accuracy"] if outcome == "accuracy_gain" else 0)
    if outcome == "mean_reward":
        return common.mean(run["reward"]["values"])
    if outcome.startswith("mechanism:"):
        return common.mean(_by_step(run, outcome.split(":", 1)[1]).values())
    _, top, bottom = outcome.split(":")  # log_ratio
    ours, theirs = _by_step(run, top), _by_step(run, bottom)
    return common.mean([math.log(a / theirs[s]) for s, a in ours.items() if theirs.get(s) and a > 0 and theirs[s] > 0])


def _by_step(run: dict[str, Any], key: str) -> dict[int, float]:
    series = run["mechanism"].get(key) or {}
    return dict(zip(series.get("steps", []), series.get("values", [])))


def mechanism_acted(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """On how many logged optimizer steps of `runs` (one configuration) its method's mechanism acted (the spec's
    `Mechanism`, the definition the trainers' report counts with); None for TRL's trainer or a method without one."""
    spec = METHODS.get(runs[0].get("method")) if runs else None
    if spec is None or spec.mechanism is None:
        return None
    mechanism, steps, acted = spec.mechanism, 0, 0
    for run in runs:
        series = [_by_step(run, key) for key in mechanism.keys]
        for step in series[0]:
            verdict = mechanism.acted_on(dict(zip(mechanism.keys, (s.get(step) for s in series))))
            if verdict is not None:  # None or NaN: nothing to measure on that step
                steps, acted = steps + 1, acted + verdict
    return {"what": mechanism.what, "steps": steps, "acted": acted, "fraction": acted / steps if steps else None}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """regime -> str(value) -> config -> mean/CI over seeds of the outcomes and of the mechanism metrics' means; with
    learning curves (sample efficiency) also the seeds reaching GRPO's mean final accuracy in the cell and Jitter2 of
    the reward curve (DFPO, arXiv:2604.13088, Eq. 20)."""
    cells: dict[tuple, list] = {}
    for run in sorted((r for r in runs if "error" not in r), key=lambda r: r["seed"]):
        cells.setdefault((run["regime"], str(run["value"]), run["config"]), []).append(run)
    summary: dict[str, Any] = {}
    for (regime, value, name), rs in cells.items():
        entry: dict[str, Any] = {"label": config_of(regime, name).label, "seeds": [r["seed"] for r in rs]}
        for outcome in ("final_accuracy", "accuracy_gain", "mean_reward"):
            per_seed = [outcome_of(r, outcome) for r in rs]
            entry[outcome] = {**common.mean_ci(per_seed), "per_seed": per_seed}
        entry["mechanism"] = {}
        logged = [
            key for key in MECHANISM_METRICS.get(rs[0].get("method", ""), ()) if any(key in r["mechanism"] for r in rs)
        ]
        for key in logged:
            per_seed, curve = [outcome_of(r, f"mechanism:{key}") for r in rs], common.mean_curve(
                [r["mechanism"].get(key) for r in rs])  # fmt: skip
            entry["mechanism"][key] = {**common.mean_ci(per_seed), "per_seed": per_seed,
                                       "mean_curve": {"steps": curve["steps"], "mean": curve["mean"]}}  # fmt: skip
        entry["train_s"] = common.mean_ci([r["train_s"] for r in rs])
        if "accuracy" in rs[0]:
            threshold = common.mean([r["final_accuracy"] for r in cells.get((regime, value, "grpo"), [])])
            jitters = [common.jitter2(r["reward"]["values"]) for r in rs]
            entry.update(num_generations=rs[0]["num_generations"], threshold_accuracy=threshold,
                         initial_accuracy=common.mean_ci([r["initial_accuracy"] for r in rs]),
                         jitter2_reward={**common.mean_ci(jitters), "per_seed": jitters},
                         reached=[common.first_step_reaching(r["accuracy"]["steps"], r["accuracy"]["values"],
                                  threshold) for r in rs if threshold is not None],
                         final_train_reward=common.mean_ci([(r["reward"]["values"] or [None])[-1] for r in rs]),
                         accuracy_curves=[r["accuracy"] for r in rs])  # fmt: skip
        summary.setdefault(regime, {}).setdefault(value, {})[name] = entry
    return summary


# ------------------------------------------------------------------------------------------------ claims
def probe_cells() -> list[tuple[str, int, str, int]]:
    """Every (regime, value, configuration, seeds) the probes run: each probe regime's cells with `PROBE_SEEDS`, and
    each probe's extra `cells` with its probed configurations."""
    cells = [(regime, value, config, PROBE_SEEDS) for regime, spec in REGIMES.items() if "probe" in spec
             for value in spec["values"] for config in spec["configs"]]  # fmt: skip
    for method, probe in PROBES.items():
        probed = [c for c in CONFIGS if CONFIGS[c].method == method and any(
            c in spec["configs"] for spec in REGIMES.values() if spec.get("probe") == method)]  # fmt: skip
        cells += [(r, v, c, n) for (r, v), n in probe["cells"].items() for c in probed]
    return cells


def cell_runs(ok: list[dict[str, Any]], regime: str, value: int, config: str) -> list[dict[str, Any]]:
    """The runs of one cell, in file order (the order the committed tables summed them in)."""
    return [r for r in ok if (r["regime"], r["value"], r["config"]) == (regime, value, config)]


def probe_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per probed cell (each probe cell, and the claims' own cells of a probed method): seeds, logged optimizer steps,
    on how many the mechanism acted, and the probed metric's range (each step's extremes over its micro-batches)."""
    ok, order = [r for r in runs if "error" not in r], {name: i for i, name in enumerate(REGIMES)}
    claimed = [(c["regime"], c["value"], c["config"]) for c in CLAIMS if c.get("probe")]
    probed = [(r, v, c) for r, v, c, _ in probe_cells() if CONFIGS[c].method in PROBES]
    rows = []
    for regime, value, config in sorted(set(claimed + probed), key=lambda c: (order[c[0]], c[1], c[2])):
        rs, spec = cell_runs(ok, regime, value, config), REGIMES[regime]
        metric = PROBES[CONFIGS[config].method]["metric"]
        low, high = ([v for r in rs for v in _extremes(r, metric, which)] for which in ("min", "max"))
        acted = mechanism_acted(rs) or {"steps": 0, "acted": 0}
        rows.append({"regime": regime, "value": value, "config": config, "seeds": len(rs),
                     "micro_batches": spec.get("micro_batches", 1),
                     "learning_rate_scale": spec.get("learning_rate_scale", 1), "metric": metric,
                     "steps": acted["steps"], "acted": acted["acted"],
                     "low": min(low) if low else None, "high": max(high) if high else None})  # fmt: skip
    return rows


def _extremes(run: dict[str, Any], metric: str, which: str) -> list[float]:
    """A run's per-step `metric` extremes (`<metric>_min` / `_max`; the step mean where they were not recorded)."""
    series = run["mechanism"].get(f"{metric}_{which}") or run["mechanism"].get(metric) or {"values": []}
    return [v for v in series["values"] if v == v]


def claim_row(claim: dict[str, Any], ok: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """`claim` on the paired seeds below `seeds`: the difference, its verdict, on how many steps the mechanism acted."""
    ours, base = ({r["seed"]: r for r in cell_runs(ok, claim["regime"], claim["value"], config) if r["seed"] < seeds}
                  for config in (claim["config"], claim["baseline"]))  # fmt: skip
    mine = {s: outcome_of(r, claim["outcome"]) for s, r in ours.items()}
    theirs = {s: outcome_of(r, claim["outcome"]) for s, r in base.items()} if claim["baseline"] else None
    acted = mechanism_acted(list(ours.values()))
    # each claim on its own at 95%, Student t (the grid's rule, docs/results.md): no bootstrap widening (resamples 0),
    # no skew note (a note holds a claim at its first stage)
    compared = stats.compare_pair(mine, theirs, better=claim["better"], accuracy=claim["outcome"].endswith("accuracy"),
                                  acted=acted, resamples=0, note_skew=False)  # fmt: skip
    row = {**claim, "n": compared["n"], "difference": compared["difference"],
           "config_outcome": common.mean_ci(list(mine.values())),
           "baseline_outcome": None if theirs is None else common.mean_ci(list(theirs.values())),
           "verdict": CLAIM_VERDICTS[compared["verdict"]], "mechanism_acted": acted,
           "max_steps": max((r["settings"]["max_steps"] for r in ours.values() if "settings" in r), default=None)}  # fmt: skip
    if compared["note"]:
        row["note"] = compared["note"].replace("the setting does not test the method", "the regime does not test "
                                               "the claim")  # fmt: skip
    return row


def claims_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`CLAIMS` on the runs, paired by seed, with the verdict of `VERDICT_RULE` on the seeds `STAGE_RULE` takes."""
    ok, rows = [r for r in runs if "error" not in r], []
    for claim in CLAIMS:
        stage1, stage2 = CLAIM_SEEDS[claim["id"]]
        row = {**claim_row(claim, ok, stage1), "stage": 1, "planned_seeds": stage1}
        if stage2 and row["verdict"] == "inconclusive" and "note" not in row and row["n"] >= stage1:
            first = {key: row[key] for key in ("n", "difference", "verdict")}
            row = {**claim_row(claim, ok, stage2), "stage": 2, "planned_seeds": stage2, "stage1": first}
        if 0 < row["n"] < row["planned_seeds"]:  # not decided before its planned seeds
            row["verdict"] = RUNNING
            row["note"] = f"{row['n']} of {row['planned_seeds']} planned seeds" + " (stage 2)" * (row["stage"] == 2)
        rows.append(row)
    return rows


def stage2_cells(rows: list[dict[str, Any]]) -> dict[tuple, int]:
    """The cells (regime, value, configuration) -> seeds that `STAGE_RULE` adds after stage 1."""
    cells: dict[tuple, int] = {}
    for row in (r for r in rows if r.get("stage") == 2):
        for key in ((row["regime"], row["value"], c) for c in (row["config"], row["baseline"]) if c):
            cells[key] = max(cells.get(key, 0), row["planned_seeds"])
    return cells
