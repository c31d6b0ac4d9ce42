"""Power analysis of the claims grid: how many seeds each claim needs to be decided (`benchmarks.stress.CLAIM_SEEDS`
holds the plan; a test checks they agree). A claim's 95% half-width over n seeds is t_{0.975, n-1} sd / sqrt(n)
(`trl_groupopt.comparison.stats.half_width`), with sd from the full grid's runs (`stress_runs.jsonl`) and from the pilot, the first
`PILOT_SEEDS` seeds of the claims grid (`claims_runs.jsonl`); the plan: `plan_from`.

    python -m benchmarks.power        # benchmarks/results/{stress,claims}_runs.jsonl -> power.json (and the table)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from trl_groupopt.comparison.runs import read_runs
from trl_groupopt.comparison.stats import half_width, seeds_needed

from . import common, stress

TARGET_HALF_WIDTH = 0.015  # accuracy: 1.5 points, comfortably inside the +-2-point band of the verdict rule
MIN_SEEDS, MAX_SEEDS = 20, 60  # stage 1; ~25 s per run (~90 s in the long regime) on one core
STAGE2_FACTOR, MAX_SEEDS_STAGE2 = 2, 100
#: The claims without a pilot when the plan was fixed (OTB's, before its zero-energy fallback, and the
#: composition's): planned from their committed sd and kept so (their first seeds are not a pilot).
PLANNED_WITHOUT_PILOT = ("otb_small_group", "otb_long", "otb_variance", "ctpo_otb_vs_ctpo", "ctpo_otb_vs_otb")


def estimate(records: list[dict[str, Any]], claim: dict[str, Any], seeds: int = 10**9) -> dict[str, Any] | None:
    """n, mean, sd and the 95% half-width of the claim's paired differences (a mechanism claim: its per-run outcome)
    over the seeds below `seeds`, paired as the claims table pairs them; None for fewer than 2."""
    d = stress.claim_row(claim, [r for r in records if "error" not in r], seeds)["difference"]
    return None if d["std"] is None else {"n": d["n"], "mean": d["mean"], "sd": d["std"], "half_width": d["ci95"]}


def analyse(committed: list[dict[str, Any]], pilot: list[dict[str, Any]]) -> dict[str, Any]:
    """Per claim: the committed and pilot estimates, the seeds for h <= 2 and <= 1.5 points, the plan, and the mean
    wall time of one pilot run of its cells."""
    rows = []
    for claim in stress.CLAIMS:
        row = {key: claim[key] for key in ("id", "paper", "claim", "regime", "value", "config", "baseline")}
        piloted = claim["id"] not in PLANNED_WITHOUT_PILOT
        walls = [r["wall_s"] for r in pilot if "error" not in r and r["seed"] < stress.PILOT_SEEDS and r["regime"] ==
                 claim["regime"] and r["value"] == claim["value"] and r["config"] in (claim["config"],
                 claim["baseline"])]  # fmt: skip
        row.update(accuracy=claim["outcome"].endswith("accuracy"), committed=estimate(committed, claim),
                   pilot=estimate(pilot, claim, stress.PILOT_SEEDS) if piloted else None,
                   run_wall_s=statistics.fmean(walls) if walls else None)  # fmt: skip
        rows.append(row)
    ratios = [r["pilot"]["sd"] / r["committed"]["sd"] for r in rows if r["accuracy"] and r["pilot"] and r["committed"]]
    ratio = statistics.median(ratios) if ratios else None
    for row in rows:
        row["planning_sd"], row["planning_source"] = (
            (row["pilot"]["sd"], "pilot") if row["pilot"] else (row["committed"]["sd"] * ratio,
            f"committed sd x {ratio:.2f} (median pilot/committed ratio)") if row["committed"] and ratio else (None, None))  # fmt: skip
        if row["accuracy"] and (sd := row["planning_sd"]) is not None:
            row.update(seeds_h2=seeds_needed(sd, 0.02), seeds_h15=seeds_needed(sd, 0.015))
    plan_of = plan_from(rows)
    for row in rows:
        row["planned_seeds"], row["stage2_seeds"] = plan_of[row["id"]]
        if row["planning_sd"] is not None and row["accuracy"]:
            row["projected_half_width"] = half_width(row["planning_sd"], row["planned_seeds"])
    return {"sd_ratio_pilot_over_committed": ratio, "ratios": ratios, "claims": rows}


def plan_from(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int | None]]:
    """Claim id -> (stage-1 seeds, stage-2 seeds): stage 1 the fewest n >= `MIN_SEEDS` (at most `MAX_SEEDS`) with a
    half-width <= `TARGET_HALF_WIDTH` at the claim's planning sd (`analyse`: the pilot's; without a pilot when the plan
    was fixed, `PLANNED_WITHOUT_PILOT`, its committed sd x the median pilot/committed ratio); stage 2, for a claim
    inconclusive at stage 1, `STAGE2_FACTOR` x stage 1 (at most `MAX_SEEDS_STAGE2`)."""
    out: dict[str, tuple[int, int | None]] = {}
    for row in rows:
        if row["accuracy"] and row.get("planning_sd") is not None:
            n = min(MAX_SEEDS, seeds_needed(row["planning_sd"], TARGET_HALF_WIDTH, MIN_SEEDS))
            out[row["id"]] = (n, min(MAX_SEEDS_STAGE2, STAGE2_FACTOR * n))
    for row in rows:  # the composition: no run at all yet, the largest plan of its regime's claims
        if row["accuracy"] and row["id"] not in out:
            same = [out[r["id"]] for r in rows if r["id"] in out and r["regime"] == row["regime"]]
            out[row["id"]] = max(same) if same else (MAX_SEEDS, MAX_SEEDS_STAGE2)
    for row in rows:  # a mechanism claim: the seeds of the accuracy claim that runs its cell
        if not row["accuracy"]:
            shared = [out[r["id"]] for r in rows if r["accuracy"] and
                      (r["regime"], r["value"], r["config"]) == (row["regime"], row["value"], row["config"])]  # fmt: skip
            out[row["id"]] = (max(shared)[0], None) if shared else (stress.PILOT_SEEDS, None)
    return out


def power_markdown(payload: dict[str, Any]) -> str:
    """The power analysis table, from power.json alone."""

    def est(e, accuracy):
        if not e:
            return "n/a | - | -"
        f = (lambda x: f"{100 * x:.1f}") if accuracy else (lambda x: f"{x:.3g}")
        return f"{e['n']} | {f(e['sd'])} | {f(e['half_width'])}"

    lines = [
        "| claim | config vs baseline | committed: seeds | sd | h | pilot: seeds | sd | h | seeds for h <= 2 | "
        "h <= 1.5 | planned seeds (stage 1 / 2) | projected h | run time (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for row in payload["claims"]:
        acc = row["accuracy"]
        versus = f"`{row['config']}` vs `{row['baseline']}`" if row["baseline"] else f"`{row['config']}` (within run)"
        projected, wall = row.get("projected_half_width"), row["run_wall_s"]
        lines.append(f"| {row['id']} | {versus} | {est(row['committed'], acc)} | {est(row['pilot'], acc)} | "
                     f"{row.get('seeds_h2', '-')} | {row.get('seeds_h15', '-')} | {row['planned_seeds']} / "
                     f"{row['stage2_seeds'] or '-'} | {'-' if projected is None else f'{100 * projected:.2f}'} | "
                     f"{'-' if wall is None else f'{wall:.0f}'} |")  # fmt: skip
    s = payload["settings"]
    ratio = payload["sd_ratio_pilot_over_committed"]
    lines += [
        "",
        f"sd: standard deviation over seeds of the paired difference (accuracy claims: in points; mechanism claims: "
        f"of the within-run log ratio); h: the 95% half-width t_(0.975, n-1) sd / sqrt(n) at those seeds. Committed: "
        f"`{s['committed']}` ({s['committed_budget']}); pilot: seeds 0-{s['pilot_seeds'] - 1} of `{s['pilot']}` "
        f"({s['pilot_budget']}). Plan: stage 1 = the fewest seeds >= {s['min_seeds']} with h <= "
        f"{100 * s['target_half_width']:.1f} points at the pilot's sd, at most {s['max_seeds']}; a claim without a "
        "pilot when the plan was fixed ("
        + ", ".join(f"`{c}`" for c in PLANNED_WITHOUT_PILOT)
        + ": it stays fixed once they run) takes its committed sd x the median pilot/committed ratio"
        + (f" ({ratio:.2f})" if ratio is not None else "")
        + f"; stage 2 = {s['stage2_factor']} x stage 1 (at most {s['max_seeds_stage2']}) for a claim inconclusive "
        "at stage 1; a mechanism claim rides on its cell's accuracy claim. Run time: mean wall time of one pilot run "
        f"of the claim's cells (one core, shared machine). Generated by `{payload['command']}`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    results = common.DEFAULT_OUTPUT_DIR
    parser.add_argument("--committed", type=Path, default=results / "stress_runs.jsonl")
    parser.add_argument("--pilot", type=Path, default=results / "claims_runs.jsonl")
    parser.add_argument("--output-dir", type=Path, default=results)
    args = parser.parse_args(argv)

    def shown(path: Path) -> str:
        path = path.resolve()
        return str(path.relative_to(common.REPO)) if path.is_relative_to(common.REPO) else str(path)

    budget = "{max_steps} optimizer steps, {num_eval} held-out prompts"  # the grids' (`stress.GRIDS`)
    settings = dict(committed=shown(args.committed), committed_budget=budget.format(**stress.GRIDS["stress"]["settings"]),
                    pilot=shown(args.pilot), pilot_budget=budget.format(**stress.GRIDS["claims"]["settings"]),
                    pilot_seeds=stress.PILOT_SEEDS, target_half_width=TARGET_HALF_WIDTH, min_seeds=MIN_SEEDS,
                    max_seeds=MAX_SEEDS, stage2_factor=STAGE2_FACTOR, max_seeds_stage2=MAX_SEEDS_STAGE2)  # fmt: skip
    records = [read_runs(path, stress.GRID).records for path in (args.committed, args.pilot)]
    payload = {"benchmark": "power", "command": common.command_line("benchmarks.power", argv), "settings": settings,
               **analyse(*records)}  # fmt: skip
    print(power_markdown(payload))
    print(f"wrote {common.write_json(args.output_dir / 'power.json', payload)}")
    return payload


if __name__ == "__main__":
    main()
