"""Paired-seed statistics of `trl-groupopt compare` and the benchmarks: the 95% Student-t interval, the verdict rule
and the power note (docs/compare.md). Standard library only, so the t quantiles are tabulated: `--help` and the
benchmarks' table rebuilds import neither torch nor scipy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# t_{0.975, df} for df = 1..30 from the standard tables (scipy.stats.t.ppf agrees to 3 decimals: tests/test_compare.py)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

#: Accuracy differences whose whole 95% interval lies inside +-this are "no difference" of practical size.
EQUIVALENCE_MARGIN = 0.02
#: Accuracy outcomes where method and baseline both end at or below this: inconclusive (nothing left to lose).
FLOOR = 0.02
Outcomes = Mapping[Any, float | None]  # seed -> outcome (None: not measured)
BETTER, WORSE, NO_DIFFERENCE, INCONCLUSIVE, NOT_RUN = "better", "worse", "no difference", "inconclusive", "not run"
VERDICT_RULE = (
    "paired by seed, d = method - baseline; better: the 95% interval of mean d lies above 0; worse: below 0; no "
    f"difference: (accuracy outcomes) it lies inside +-{100 * EQUIVALENCE_MARGIN:.0f} points; inconclusive otherwise, "
    f"and whenever both method and baseline end at <= {FLOOR:.0%} accuracy (floor effect) or the method's mechanism "
    "acted on none of its optimizer steps (the setting does not test it); fewer than 2 paired seeds: inconclusive"
)


# beyond df 30: the tables' rows 40, 60, 120 and infinity, interpolated linearly in 1/df as the tables intend (within
# 1e-3 of scipy up to df 1000: tests/test_compare.py)
_T975_TAIL = ((30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980), (math.inf, 1.960))


def t_quantile_975(df: int) -> float:
    """Two-sided 95% Student-t quantile for `df` degrees of freedom (NaN below 1)."""
    if df < 1:
        return float("nan")
    if df <= len(_T975):
        return _T975[df - 1]
    for (df0, t0), (df1, t1) in zip(_T975_TAIL, _T975_TAIL[1:]):
        if df <= df1:
            share = (1 / df0 - 1 / df) / (1 / df0 - 1 / df1)
            return t0 + share * (t1 - t0)
    return _T975_TAIL[-1][1]


def present(values: Sequence[float | None]) -> list[float]:
    """The values that were measured: None (no such seed or step) and NaN left out."""
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def mean(values: Sequence[float | None]) -> float | None:
    """Mean of the measured values (`present`); None when there is none."""
    xs = present(values)
    return sum(xs) / len(xs) if xs else None


def mean_ci(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and 95% Student-t interval (`ci95`: half-width) of the measured values; no interval for fewer than 2."""
    xs, average = present(values), mean(values)
    n = len(xs)
    if n < 2:
        return {"mean": average, "ci95": None, "low": None, "high": None, "n": n, "std": None}
    std = math.sqrt(sum((x - average) ** 2 for x in xs) / (n - 1))  # sample standard deviation
    half = half_width(std, n)
    return {"mean": average, "ci95": half, "low": average - half, "high": average + half, "n": n, "std": std}


def paired_differences(ours: Outcomes, theirs: Outcomes) -> list[float | None]:
    """`ours[k] - theirs[k]` for every key both hold (seeds), in key order; None where either value is missing."""
    keys = sorted(set(ours) & set(theirs))
    return [None if ours[k] is None or theirs[k] is None else ours[k] - theirs[k] for k in keys]


def half_width(sd: float, n: int) -> float:
    """The 95% Student-t half-width of a mean over n seeds of standard deviation sd."""
    return t_quantile_975(n - 1) * sd / math.sqrt(n)


def seeds_needed(sd: float, target: float, minimum: int = 2) -> int:
    """The smallest n >= minimum with `half_width(sd, n) <= target`."""
    n = max(minimum, 2)
    while half_width(sd, n) > target:
        n += 1
    return n


def stein_total(pilot_sd: float, pilot_n: int, target: float = EQUIVALENCE_MARGIN) -> int:
    """Stein's two-stage rule (Stein 1945, Ann. Math. Statist. 16:243): after a pilot of `pilot_n` values of standard
    deviation `pilot_sd`, the smallest total N >= pilot_n with t(0.975, pilot_n - 1) * pilot_sd / sqrt(N) <= target.
    N depends on the pilot's spread alone, so :func:`stein_ci` over the N values keeps its 95% coverage."""
    t = t_quantile_975(pilot_n - 1)
    n = max(pilot_n, math.ceil((t * pilot_sd / target) ** 2))
    while t * pilot_sd / math.sqrt(n) > target:  # the float square root of the ceiling: never one short
        n += 1
    while n > pilot_n and t * pilot_sd / math.sqrt(n - 1) <= target:
        n -= 1
    return n


def stein_ci(values: Sequence[float | None], pilot_sd: float, pilot_n: int) -> dict[str, Any]:
    """`mean_ci`'s result for Stein's interval: the mean of all the measured values (pilot included) +- t(0.975,
    pilot_n - 1) * pilot_sd / sqrt(n), the pilot's spread and degrees of freedom (`std` stays the observed one)."""
    result = {**mean_ci(values), "pilot_sd": pilot_sd, "pilot_n": pilot_n}
    if result["n"] < 1 or pilot_n < 2:
        return result
    half = t_quantile_975(pilot_n - 1) * pilot_sd / math.sqrt(result["n"])
    return {**result, "ci95": half, "low": result["mean"] - half, "high": result["mean"] + half}


def verdict(stats: Mapping[str, Any], better: int = +1, margin: float | None = EQUIVALENCE_MARGIN) -> str:
    """:data:`VERDICT_RULE` on the interval of the mean paired difference (`mean_ci`'s result): `better` is +1 when
    a larger outcome is better, -1 when smaller is; `margin` the equivalence band (None: no band, e.g. a mechanism
    metric). The floor and idle-mechanism cases are :func:`compare_pair`'s."""
    if stats["n"] < 2 or stats["low"] is None:
        return INCONCLUSIVE if stats["n"] else NOT_RUN
    low, high = sorted((stats["low"] * better, stats["high"] * better))
    if low > 0:
        return BETTER
    if high < 0:
        return WORSE
    if margin is not None and -margin < stats["low"] and stats["high"] < margin:
        return NO_DIFFERENCE
    return INCONCLUSIVE


def compare_pair(
    ours: Outcomes,
    theirs: Outcomes | None,
    *,
    better: int = +1,
    accuracy: bool = True,
    acted: Mapping | None = None,
    pilot: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """One comparison by :data:`VERDICT_RULE` of seed -> outcome maps (`theirs` None: `ours` are already the paired
    differences); `accuracy` applies the band and the floor; `acted` ({"steps", "acted", "what"}) is how often the
    mechanism acted; `pilot` (n, sd) makes the interval Stein's (`stein_ci`: the seeds were planned from that pilot).
    Returns {"n", "difference" (`mean_ci`), "per_seed", "verdict", "note", "power"}."""
    per_seed = list(ours.values()) if theirs is None else paired_differences(ours, theirs)
    stats = mean_ci(per_seed) if pilot is None else stein_ci(per_seed, pilot[1], pilot[0])
    row: dict[str, Any] = {"n": stats["n"], "difference": stats, "per_seed": per_seed, "note": None}
    row["verdict"] = verdict(stats, better, EQUIVALENCE_MARGIN if accuracy else None)
    levels = [mean(list(ours.values())), mean(list(theirs.values())) if theirs is not None else None]
    if accuracy and stats["n"] and all(v is not None and v <= FLOOR for v in levels):
        row["verdict"], row["note"] = INCONCLUSIVE, f"both at <= {FLOOR:.0%} accuracy: floor effect"
    elif acted and acted.get("steps") and not acted.get("acted"):
        row["verdict"] = INCONCLUSIVE  # the method ran as its baseline's objective: nothing of it was compared
        row["note"] = f"{acted['what']} on no optimizer step: the setting does not test the method"
    row["power"] = power_note(stats) if accuracy else None
    return row


def power_note(stats: Mapping[str, Any], target: float = EQUIVALENCE_MARGIN) -> dict[str, Any] | None:
    """From the observed paired spread: the seeds that would give a 95% half-width of `target` (2 points), and one
    line saying so; None for fewer than 2 seeds. A zero spread needs 2 seeds."""
    if stats.get("std") is None:
        return None
    n = seeds_needed(stats["std"], target)
    text = (
        f"paired sd {100 * stats['std']:.1f} points over {stats['n']} seeds: {n} seeds give a 95% interval of "
        f"+-{100 * target:.0f} points (now +-{100 * stats['ci95']:.1f})"
    )
    return {"sd": stats["std"], "target_half_width": target, "seeds_for_target": n, "text": text}
