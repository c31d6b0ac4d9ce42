"""How often do the verdicts of `trl-groupopt compare` hold? Simulated with the library's own interval
(`trl_groupopt.comparison.stats.paired_intervals`, the one `paired_interval` gives each comparison), no training:

- coverage: the share of intervals holding the true mean paired difference, the Student-t interval alone and the
  interval compare reports (t widened to the studentized bootstrap's), for normal, skewed (lognormal of skewness
  about 1.75 and 6, its long tail on the low side, as a seed that collapses makes it), heavy-tailed (t, 3 degrees of
  freedom) and 5% collapse-mixture differences, at 8, 16 and 32 seeds;
- the familywise false-verdict rate: k methods against one baseline, none truly different (the global null), the
  share of comparisons with at least one "better" or "worse", without and with the correction;
- the cost of "no difference": at a true difference of 0, how often `--seeds auto` reaches it, and with how many
  seeds, for the old plan (+-2 points, t) and the current one (+-1 point, the reported interval).

    python -m benchmarks.compare_coverage            # prints the tables, writes benchmarks/results/compare_coverage.json
    python -m benchmarks.compare_coverage --trials 2000 --output-dir /tmp/x      # a quick look
    python -m benchmarks.compare_coverage --markdown  # the tables of docs/compare.md, from the committed JSON
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_OUTPUT_DIR, command_line, print_table, write_json

#: name -> (description, sampler of standardised differences: mean 0, sd 1)
DISTRIBUTIONS = {
    "normal": "normal",
    "lognormal-1.75": "lognormal, skewness -1.75 (sigma 0.5, reflected: a long low tail)",
    "lognormal-6": "lognormal, skewness -6.2 (sigma 1, reflected)",
    "t3": "Student t, 3 degrees of freedom",
    "collapse-4": "5% of seeds collapse: 4 sd below the others",
    "collapse-8": "5% of seeds collapse: 8 sd below the others",
}
SEEDS = (8, 16, 32)
FAMILIES = (1, 2, 3, 5)
RESULT = "compare_coverage.json"


def draw(rng: Any, kind: str, shape: tuple[int, ...]) -> Any:
    """Standardised differences (mean 0, sd 1) of one of `DISTRIBUTIONS`."""
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind.startswith("lognormal"):
        s = 0.5 if kind.endswith("1.75") else 1.0
        x = rng.lognormal(0.0, s, shape)
        return -(x - math.exp(s * s / 2)) / math.sqrt((math.exp(s * s) - 1) * math.exp(s * s))
    if kind == "t3":
        return rng.standard_t(3, shape) / math.sqrt(3.0)
    drop = float(kind.split("-")[1])
    x = rng.standard_normal(shape) - drop * (rng.random(shape) < 0.05)
    return (x + drop * 0.05) / math.sqrt(1 + drop * drop * 0.05 * 0.95)


def needed_widening(rep: dict[str, Any]) -> Any:
    """Per comparison, the factor by which its interval, widened about its mean, must grow to hold the true mean 0
    (at most 1: it already holds it)."""
    import numpy as np

    m = (rep["low"] + rep["high"]) / 2  # any centre inside the interval serves; the midpoint keeps both sides
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(m > 0, m / (m - rep["low"]), -m / (rep["high"] - m))
    return np.nan_to_num(c, nan=0.0, posinf=np.inf)


def coverage(rng: Any, trials: int, resamples: int) -> list[dict[str, Any]]:
    """Per distribution and seed count: coverage and one-sided misses of the t and the reported interval at 95%; the
    share the skewness test flags (`stats.SKEW_P`), their coverage and the share of misses among the unflagged; the
    widening every interval would need for 95% coverage there, and the coverage of normal differences widened
    alike."""
    import numpy as np

    from trl_groupopt.comparison import stats

    rows, normal = [], {}
    for kind in DISTRIBUTIONS:
        for n in SEEDS:
            d = draw(rng, kind, (trials, n))
            t = stats.paired_intervals(d, stats.ALPHA, 0)
            rep = stats.paired_intervals(d, stats.ALPHA, resamples)
            held, flagged = (rep["low"] <= 0) & (rep["high"] >= 0), rep["skew_p"] < stats.SKEW_P
            c = needed_widening(rep)
            normal.setdefault(n, c)  # "normal" comes first
            widen = float(max(1.0, np.quantile(c, 0.95)))
            rows.append({"distribution": kind, "seeds": n, "trials": trials,
                         "t_coverage": float(np.mean((t["low"] <= 0) & (t["high"] >= 0))),
                         "t_false_better": float(np.mean(t["low"] > 0)), "t_false_worse": float(np.mean(t["high"] < 0)),
                         "coverage": float(np.mean(held)),
                         "false_better": float(np.mean(rep["low"] > 0)), "false_worse": float(np.mean(rep["high"] < 0)),
                         "widened": float(np.mean(rep["widened"])),
                         "width_ratio": float(np.median((rep["high"] - rep["low"]) / (t["high"] - t["low"]))),
                         "skew_flagged": float(np.mean(flagged)),
                         "misses_unflagged": float(np.sum(~held & ~flagged) / max(1, np.sum(~held))),
                         "coverage_flagged": float(np.mean(held[flagged])) if flagged.any() else None,
                         "widening_for_95": widen,
                         "normal_coverage_widened": float(np.mean(normal[n] <= widen))})  # fmt: skip
            print(f"  coverage {kind} n={n}: t {rows[-1]['t_coverage']:.4f}, reported {rows[-1]['coverage']:.4f}",
                  flush=True)  # fmt: skip
    return rows


def familywise(rng: Any, trials: int, resamples: int, n: int = 8) -> list[dict[str, Any]]:
    """k methods and a baseline with the same accuracy distribution (a seed effect they share, and each run's own
    noise): the share of comparisons with any better/worse verdict, uncorrected t and as compare judges."""
    import numpy as np

    from trl_groupopt.comparison import stats

    rows = []
    for k in FAMILIES:
        seed_effect = rng.standard_normal((trials, 1, n))
        acc = seed_effect + rng.standard_normal((trials, k + 1, n))  # row 0: the baseline
        d = (acc[:, 1:, :] - acc[:, :1, :]).reshape(trials * k, n)
        plain = stats.paired_intervals(d, stats.ALPHA, 0)
        judged = stats.paired_intervals(d, stats.family_alpha(k), resamples)

        def any_false(r: dict, k: int = k) -> float:
            return float(np.mean(((r["low"] > 0) | (r["high"] < 0)).reshape(trials, k).any(-1)))

        rows.append({"k": k, "seeds": n, "comparisons": trials, "uncorrected_t": any_false(plain),
                     "reported": any_false(judged), "correction": stats.CORRECTION})  # fmt: skip
        print(f"  familywise k={k}: uncorrected {rows[-1]['uncorrected_t']:.4f}, reported {rows[-1]['reported']:.4f}",
              flush=True)  # fmt: skip
    return rows


def reach(rng: Any, trials: int, resamples: int) -> list[dict[str, Any]]:
    """At a true difference of 0: the share of `--seeds auto` comparisons (pilot 8) ending "no difference", and their
    mean seeds, for the old plan (+-2 points, t interval) and the current one (`seeds.plan`'s +-1 point, floor, the
    reported interval), k = 1 and 3 methods, paired sd 2 and 4 points, cap 40 (the default) and 1000."""
    from trl_groupopt.comparison import seeds, stats

    rows = []
    for k in (1, 3):
        alpha = stats.family_alpha(k)
        for sd in (0.02, 0.04):
            for cap in (seeds.MAX_SEEDS, 1000):
                for plan in ("old", "current"):
                    reached, totals = 0, []
                    for _ in range(trials):
                        d = list(sd * draw(rng, "normal", (cap,)))
                        s0 = stats.mean_ci(d[: seeds.PILOT_SEEDS])["std"]
                        if plan == "old":  # as before issue 49: +-2 points at 95% for each method, no floor
                            n = min(cap, stats.stein_total(s0, seeds.PILOT_SEEDS, 0.02, stats.ALPHA))
                            row = stats.paired_interval(d[:n], stats.ALPHA, (seeds.PILOT_SEEDS, s0), 0)
                        else:
                            s0 = max(s0, seeds.SD_FLOOR)
                            n = min(cap, stats.stein_total(s0, seeds.PILOT_SEEDS, stats.PLAN_HALF_WIDTH, alpha))
                            row = stats.paired_interval(d[:n], alpha, (seeds.PILOT_SEEDS, s0), resamples)
                        reached += stats.verdict(row) == stats.NO_DIFFERENCE
                        totals.append(n)
                    rows.append({"plan": plan, "k": k, "paired_sd": sd, "max_seeds": cap, "trials": trials,
                                 "no_difference": reached / trials, "mean_seeds": sum(totals) / trials})  # fmt: skip
                    print(f"  reach {plan} k={k} sd={sd} cap={cap}: {reached / trials:.3f}", flush=True)
    return rows


def tables(payload: dict[str, Any]) -> str:
    """The four markdown tables of docs/compare.md."""
    cov = ["| differences | seeds | t interval | reported | false better (t / reported) | widened by bootstrap-t |",
           "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in payload["coverage"]:
        cov.append(f"| {DISTRIBUTIONS[r['distribution']]} | {r['seeds']} | {r['t_coverage']:.1%} | {r['coverage']:.1%} "
                   f"| {r['t_false_better']:.1%} / {r['false_better']:.1%} | {r['widened']:.0%} |")  # fmt: skip
    cost95 = ["| differences | seeds | reported | misses in samples the skewness test does not flag | flagged | "
              "flagged covered | widening for 95% | normal differences then covered |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in payload["coverage"]:
        if r["coverage"] < 0.93:
            cost95.append(f"| {DISTRIBUTIONS[r['distribution']]} | {r['seeds']} | {r['coverage']:.1%} | "
                          f"{r['misses_unflagged']:.0%} | {r['skew_flagged']:.0%} | {r['coverage_flagged']:.1%} | "
                          f"{r['widening_for_95']:.2f}x | {r['normal_coverage_widened']:.1%} |")  # fmt: skip
    fam = ["| methods k | uncorrected t (any false better/worse) | as compare judges |", "|---:|---:|---:|"]
    for r in payload["familywise"]:
        fam.append(f"| {r['k']} | {r['uncorrected_t']:.1%} | {r['reported']:.1%} |")
    cost = ["| k | paired sd | --max_seeds | old plan: no difference / seeds | current: no difference / seeds |",
            "|---:|---:|---:|---:|---:|"]  # fmt: skip
    pairs: dict[tuple, dict[str, Any]] = {}
    for r in payload["reach"]:
        pairs.setdefault((r["k"], r["paired_sd"], r["max_seeds"]), {})[r["plan"]] = r
    for (k, sd, cap), p in pairs.items():
        cost.append(f"| {k} | {100 * sd:.0f} points | {cap} | {p['old']['no_difference']:.1%} / "
                    f"{p['old']['mean_seeds']:.0f} | {p['current']['no_difference']:.1%} / "
                    f"{p['current']['mean_seeds']:.0f} |")  # fmt: skip
    return "\n".join(["\n".join(cov), "", "\n".join(cost95), "", "\n".join(fam), "", "\n".join(cost)]) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10_000, help="simulated comparisons per cell (default 10,000)")
    parser.add_argument("--reach-trials", type=int, default=1_000, help="comparisons per cell of the cost table")
    parser.add_argument("--resamples", type=int, default=1999, help="bootstrap resamples (compare's: 9999)")
    parser.add_argument("--markdown", action="store_true", help="print the docs tables from the committed JSON")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    args = parser.parse_args(argv)
    if args.markdown:
        payload = json.loads((args.output_dir / RESULT).read_text())
        print(tables(payload), end="")
        return payload
    import numpy as np

    rng, started = np.random.default_rng(49), time.perf_counter()
    payload = {"benchmark": "compare_coverage", "command": command_line("benchmarks.compare_coverage", argv),
               "trials": args.trials, "reach_trials": args.reach_trials, "resamples": args.resamples,
               "coverage": coverage(rng, args.trials, args.resamples),
               "familywise": familywise(rng, args.trials, args.resamples),
               "reach": reach(rng, args.reach_trials, args.resamples)}  # fmt: skip
    payload["wall_s"] = time.perf_counter() - started
    write_json(args.output_dir / RESULT, payload)
    print(tables(payload), end="")
    print_table(["file"], [[str(args.output_dir / RESULT)]])
    return payload


if __name__ == "__main__":
    main()
