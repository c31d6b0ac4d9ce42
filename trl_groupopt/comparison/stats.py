"""Paired-seed statistics of `trl-groupopt compare` and the benchmarks: Student-t intervals, the paired interval a
verdict is read from (the t interval widened to the studentized bootstrap's where that reaches further), the
familywise correction for several methods, the verdict rule and the power note (docs/compare.md). The quantiles are
scipy's and the bootstrap numpy's, both imported inside the functions that use them: `--help` imports neither."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

#: Accuracy differences whose whole interval lies inside +-this are "no difference" of practical size.
EQUIVALENCE_MARGIN = 0.02
#: The half-width `--seeds auto` plans for and the power note aims at: half the margin, so that "no difference" is
#: reached when it is true (an interval of half-width h around a true 0 fits inside +-2h unless the mean strays by h).
PLAN_HALF_WIDTH = EQUIVALENCE_MARGIN / 2
#: Accuracy outcomes where method and baseline both end at or below this: inconclusive (nothing left to lose).
FLOOR = 0.02
#: The familywise error of a comparison's verdicts, all methods together.
ALPHA = 0.05
#: How the k comparisons against one baseline share ALPHA: each interval is at level 1 - ALPHA / k, so the k hold
#: together with probability >= 1 - ALPHA (Bonferroni's inequality), whatever the correlation through the baseline.
CORRECTION = "bonferroni"
#: The studentized bootstrap's resamples (a fixed seed: the same runs always give the same interval).
BOOTSTRAP_RESAMPLES = 9999
#: Below this many seeds the t interval alone: a bootstrap of fewer values has too few distinct resamples.
BOOTSTRAP_MIN_SEEDS = 5
#: A skewness test (D'Agostino's, `scipy.stats.skewtest`, from 8 seeds) below this p-value flags the differences as
#: skewed: compare notes it next to the verdict (docs/compare.md, "Where no interval holds").
SKEW_P, SKEW_MIN_SEEDS = 0.01, 8
T, STEIN, BOOTSTRAP_T = "t", "stein", "bootstrap-t"  # the procedure that set an interval's bounds
Outcomes = Mapping[Any, float | None]  # seed -> outcome (None: not measured)
BETTER, WORSE, NO_DIFFERENCE, INCONCLUSIVE, NOT_RUN = "better", "worse", "no difference", "inconclusive", "not run"
VERDICT_RULE = (
    "paired by seed, d = method - baseline; each method's interval of mean d is the Student-t interval, widened to "
    f"the studentized bootstrap (bootstrap-t) interval where that reaches further (skewed d; {BOOTSTRAP_MIN_SEEDS}+ "
    f"seeds), at level 1 - {ALPHA:g}/k for k methods against the baseline ({CORRECTION} correction: all k verdicts "
    f"hold together at {1 - ALPHA:.0%}); better: the interval lies above 0; worse: below 0; no difference: "
    f"(accuracy outcomes) it lies inside +-{100 * EQUIVALENCE_MARGIN:.0f} points; inconclusive otherwise, and "
    f"whenever both method and baseline end at <= {FLOOR:.0%} accuracy (floor effect) or the method's mechanism "
    "acted on none of its optimizer steps (the setting does not test it); fewer than 2 paired seeds: inconclusive"
)


def family_alpha(k: int) -> float:
    """The two-sided error each of `k` comparisons against one baseline is judged at (:data:`CORRECTION`)."""
    return ALPHA / max(1, k)


@functools.lru_cache(maxsize=4096)  # the plan and the power note ask for the same few quantiles many times
def t_quantile(df: float, alpha: float = ALPHA) -> float:
    """The two-sided `1 - alpha` Student-t quantile t(1 - alpha/2, df) (scipy's); NaN below 1 degree of freedom."""
    if df < 1:
        return float("nan")
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf(1 - alpha / 2, df))


def present(values: Sequence[float | None]) -> list[float]:
    """The values that were measured: None (no such seed or step) and NaN left out."""
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def mean(values: Sequence[float | None]) -> float | None:
    """Mean of the measured values (`present`); None when there is none."""
    xs = present(values)
    return sum(xs) / len(xs) if xs else None


def mean_ci(values: Sequence[float | None], alpha: float = ALPHA) -> dict[str, Any]:
    """Mean and `1 - alpha` Student-t interval (`ci95`: half-width) of the measured values; no interval for fewer
    than 2."""
    xs, average = present(values), mean(values)
    n = len(xs)
    if n < 2:
        return {"mean": average, "ci95": None, "low": None, "high": None, "n": n, "std": None}
    std = math.sqrt(sum((x - average) ** 2 for x in xs) / (n - 1))  # sample standard deviation
    half = half_width(std, n, alpha)
    return {"mean": average, "ci95": half, "low": average - half, "high": average + half, "n": n, "std": std}


def paired_differences(ours: Outcomes, theirs: Outcomes) -> list[float | None]:
    """`ours[k] - theirs[k]` for every key both hold (seeds), in key order; None where either value is missing."""
    keys = sorted(set(ours) & set(theirs))
    return [None if ours[k] is None or theirs[k] is None else ours[k] - theirs[k] for k in keys]


def half_width(sd: float, n: int, alpha: float = ALPHA) -> float:
    """The `1 - alpha` Student-t half-width of a mean over n seeds of standard deviation sd."""
    return t_quantile(n - 1, alpha) * sd / math.sqrt(n)


def seeds_needed(sd: float, target: float, minimum: int = 2, alpha: float = ALPHA) -> int:
    """The smallest n >= minimum with `half_width(sd, n, alpha) <= target`."""
    n = max(minimum, 2)
    while half_width(sd, n, alpha) > target:
        n += 1
    return n


def stein_total(pilot_sd: float, pilot_n: int, target: float = PLAN_HALF_WIDTH, alpha: float = ALPHA) -> int:
    """Stein's two-stage rule (Stein 1945, Ann. Math. Statist. 16:243): after a pilot of `pilot_n` values of standard
    deviation `pilot_sd`, the smallest total N >= pilot_n with t(1 - alpha/2, pilot_n - 1) * pilot_sd / sqrt(N) <=
    target. N depends on the pilot's spread alone, so :func:`stein_ci` over the N values keeps its coverage."""
    t = t_quantile(pilot_n - 1, alpha)
    n = max(pilot_n, math.ceil((t * pilot_sd / target) ** 2))
    while t * pilot_sd / math.sqrt(n) > target:  # the float square root of the ceiling: never one short
        n += 1
    while n > pilot_n and t * pilot_sd / math.sqrt(n - 1) <= target:
        n -= 1
    return n


def stein_ci(values: Sequence[float | None], pilot_sd: float, pilot_n: int, alpha: float = ALPHA) -> dict[str, Any]:
    """`mean_ci`'s result for Stein's interval: the mean of all the measured values (pilot included) +- t(1 - alpha/2,
    pilot_n - 1) * pilot_sd / sqrt(n), the pilot's spread and degrees of freedom (`std` stays the observed one)."""
    result = {**mean_ci(values, alpha), "pilot_sd": pilot_sd, "pilot_n": pilot_n}
    if result["n"] < 1 or pilot_n < 2:
        return result
    half = t_quantile(pilot_n - 1, alpha) * pilot_sd / math.sqrt(result["n"])
    return {**result, "ci95": half, "low": result["mean"] - half, "high": result["mean"] + half}


def bootstrap_t(d: Any, alpha: float = ALPHA, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple:
    """The studentized bootstrap ("bootstrap-t", Efron & Tibshirani 1993, An Introduction to the Bootstrap, ch. 12.5)
    interval of the mean of each row of `d` (array (..., n), n >= 2): (low, high, p), arrays over the leading axes;
    p is the two-sided p-value of mean 0 by the same resamples. Its bounds follow the skew of d (a long left tail
    pushes the low bound down), where the t interval stays symmetric. A resample whose values are all equal takes
    the standard deviation sd(d) / n instead of 0: its t is large but finite (a bound far out on that side, not an
    infinite one; such resamples arise where one seed differs from all the others). Vectorised: the simulations call
    it on thousands of rows at once."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    m, se = d.mean(-1), d.std(-1, ddof=1) / math.sqrt(n)
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    boot = d[..., picks]  # (..., resamples, n)
    spread = np.maximum(boot.std(-1, ddof=1), d.std(-1, ddof=1)[..., None] / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (boot.mean(-1) - m[..., None]) / (spread / math.sqrt(n))
        t_obs = np.where(se > 0, m / se, np.sign(m) * np.inf)
    t_star = np.where(np.isnan(t_star), 0.0, t_star)  # a resample of equal values at the mean itself
    q_low, q_high = np.quantile(t_star, [alpha / 2, 1 - alpha / 2], axis=-1)
    above, below = (t_star >= t_obs[..., None]).mean(-1), (t_star <= t_obs[..., None]).mean(-1)
    return m - q_high * se, m - q_low * se, np.minimum(1.0, 2 * np.minimum(above, below))


def skew_p(d: Any) -> Any:
    """D'Agostino's skewness test p-value (`scipy.stats.skewtest`) of each row of `d` (array (..., n)); NaN for
    fewer than `SKEW_MIN_SEEDS` values or a row without spread (nothing to test)."""
    import numpy as np
    from scipy import stats as scipy_stats

    d = np.asarray(d, dtype=float)
    if d.shape[-1] < SKEW_MIN_SEEDS:
        return np.full(d.shape[:-1], np.nan)
    spread = d.std(-1) > 1e-12 * np.maximum(1.0, np.abs(d).max(-1))
    with np.errstate(all="ignore"):
        p = scipy_stats.skewtest(np.where(spread[..., None], d, 0.0), axis=-1).pvalue
    return np.where(spread, p, np.nan)


def t_p_value(mean_d: float, se: float, df: float) -> float:
    """Two-sided p-value of mean 0 for a t statistic mean_d / se on df degrees of freedom (se 0: 0 or 1)."""
    if se <= 0:
        return 1.0 if mean_d == 0 else 0.0
    from scipy import stats as scipy_stats

    return float(min(1.0, 2 * scipy_stats.t.sf(abs(mean_d) / se, df)))


def paired_interval(values: Sequence[float | None], alpha: float = ALPHA, pilot: tuple[int, float] | None = None,
                    resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:  # fmt: skip
    """The `1 - alpha` interval of the mean paired difference a verdict is read from: the Student-t interval (Stein's,
    `stein_ci`, with a `pilot` (n, sd)), widened on each side to the studentized bootstrap's (`bootstrap_t`) where
    that reaches further (from `BOOTSTRAP_MIN_SEEDS` seeds; `resamples` 0: never). Under skewed differences the t
    interval undercovers on the side of the long tail; the bootstrap-t bound follows it (docs/compare.md, the
    coverage table). `mean_ci`'s keys, with `ci95` the larger side, and `p_value` (of mean 0, the larger of the two
    procedures': the interval excludes 0 where it is below alpha) and `procedure` (`T` or `STEIN`, or `BOOTSTRAP_T`
    where the bootstrap set a bound)."""
    xs = present(values)
    row = mean_ci(xs, alpha) if pilot is None else stein_ci(xs, pilot[1], pilot[0], alpha)
    row = {**row, "alpha": alpha, "procedure": T if pilot is None else STEIN, "p_value": None}
    if row["low"] is None:
        return row
    n = row["n"]
    sd, df = (row["std"], n - 1) if pilot is None else (pilot[1], pilot[0] - 1)
    row["p_value"] = t_p_value(row["mean"], sd / math.sqrt(n), df)
    if resamples and n >= BOOTSTRAP_MIN_SEEDS:
        low, high, p = (float(v) for v in bootstrap_t(xs, alpha, resamples))
        if low < row["low"] or high > row["high"]:
            row.update(low=min(low, row["low"]), high=max(high, row["high"]), procedure=BOOTSTRAP_T)
            row["ci95"] = max(row["mean"] - row["low"], row["high"] - row["mean"])
        row["p_value"] = max(row["p_value"], p)
    return row


def verdict(stats: Mapping[str, Any], better: int = +1, margin: float | None = EQUIVALENCE_MARGIN) -> str:
    """:data:`VERDICT_RULE` on the interval of the mean paired difference (`mean_ci`'s or `paired_interval`'s
    result): `better` is +1 when a larger outcome is better, -1 when smaller is; `margin` the equivalence band (None:
    no band, e.g. a mechanism metric). The floor and idle-mechanism cases are :func:`compare_pair`'s."""
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
    family: int = 1,
    resamples: int = BOOTSTRAP_RESAMPLES,
    note_skew: bool = True,
) -> dict[str, Any]:
    """One comparison by :data:`VERDICT_RULE` of seed -> outcome maps (`theirs` None: `ours` are already the paired
    differences), one of `family` methods judged against the same baseline (:data:`CORRECTION`); `accuracy` applies
    the band and the floor; `acted` ({"steps", "acted", "what"}) is how often the mechanism acted; `pilot` (n, sd)
    makes the t interval Stein's (the seeds were planned from that pilot); `note_skew` notes skewed differences
    (`skew_p` below `SKEW_P`: `skew_note`). Returns {"n", "difference" (`paired_interval`), "per_seed", "verdict",
    "note", "power", "p_value", "p_adjusted", "correction", "family", "skew_p" (None below `SKEW_MIN_SEEDS` seeds or
    without spread)}."""
    per_seed = list(ours.values()) if theirs is None else paired_differences(ours, theirs)
    alpha = family_alpha(family)
    stats = paired_interval(per_seed, alpha, pilot, resamples)
    p = stats["p_value"]
    row: dict[str, Any] = {"n": stats["n"], "difference": stats, "per_seed": per_seed, "note": None, "p_value": p,
                           "p_adjusted": None if p is None else min(1.0, family * p), "correction": CORRECTION,
                           "family": family, "skew_p": None}  # fmt: skip
    if not math.isnan(p_skew := float(skew_p(present(per_seed)))):
        row["skew_p"] = p_skew
    row["verdict"] = verdict(stats, better, EQUIVALENCE_MARGIN if accuracy else None)
    levels = [mean(list(ours.values())), mean(list(theirs.values())) if theirs is not None else None]
    if accuracy and stats["n"] and all(v is not None and v <= FLOOR for v in levels):
        row["verdict"], row["note"] = INCONCLUSIVE, f"both at <= {FLOOR:.0%} accuracy: floor effect"
    elif acted and acted.get("steps") and not acted.get("acted"):
        row["verdict"] = INCONCLUSIVE  # the method ran as its baseline's objective: nothing of it was compared
        row["note"] = f"{acted['what']} on no optimizer step: the setting does not test the method"
    elif note_skew and row["skew_p"] is not None and row["skew_p"] < SKEW_P:
        row["note"] = skew_note(row["skew_p"], stats["n"])
    row["power"] = power_note(stats, alpha=alpha) if accuracy else None
    return row


def skew_note(p: float, n: int) -> str:
    """The note of a verdict read from skewed differences (`SKEW_P`): at such outcomes an interval from this many
    seeds misses more often than its level, on the samples that do not show the tail (docs/compare.md)."""
    return (f"skewed differences, skewness test p = {p:.2g}: outcomes with such a tail can undercover at {n} seeds "
            "(docs/compare.md); check the per-seed values, add seeds")  # fmt: skip


def power_note(stats: Mapping[str, Any], target: float = PLAN_HALF_WIDTH, alpha: float = ALPHA) -> dict | None:
    """From the observed paired spread: the seeds that would give a `1 - alpha` half-width of `target` (1 point: at
    which "no difference" is within reach), and one line saying so; None for fewer than 2 seeds. A zero spread
    needs 2 seeds."""
    if stats.get("std") is None:
        return None
    n = seeds_needed(stats["std"], target, alpha=alpha)
    text = (
        f"paired sd {100 * stats['std']:.1f} points over {stats['n']} seeds: {n} seeds give a {1 - alpha:.1%} "
        f"interval of +-{100 * target:g} point{'s' * (100 * target != 1)} (now +-{100 * stats['ci95']:.1f})"
    )
    return {"sd": stats["std"], "target_half_width": target, "seeds_for_target": n, "text": text}


def paired_intervals(d: Any, alpha: float = ALPHA, resamples: int = BOOTSTRAP_RESAMPLES, chunk: int = 256) -> dict:
    """`paired_interval` (without a pilot) of each row of `d` (array (rows, n), every value measured) at once, for
    the simulations (tests/test_compare_stats.py, benchmarks/compare_coverage.py): {"low", "high", "p_value",
    "widened" (the bootstrap-t set a bound), "skew_p"}, arrays over the rows. Rows go through the bootstrap `chunk` at
    a time (its resamples are rows x resamples x n values)."""
    import numpy as np

    d = np.atleast_2d(np.asarray(d, dtype=float))
    n = d.shape[-1]
    m, se = d.mean(-1), d.std(-1, ddof=1) / math.sqrt(n)
    half = t_quantile(n - 1, alpha) * se
    low, high = m - half, m + half
    from scipy import stats as scipy_stats

    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(se > 0, np.minimum(1.0, 2 * scipy_stats.t.sf(np.abs(m) / se, n - 1)), (m != 0) * -1.0 + 1.0)
    widened = np.zeros(len(d), dtype=bool)
    if resamples and n >= BOOTSTRAP_MIN_SEEDS:
        for start in range(0, len(d), chunk):
            rows = slice(start, start + chunk)
            b_low, b_high, b_p = bootstrap_t(d[rows], alpha, resamples)
            widened[rows] = (b_low < low[rows]) | (b_high > high[rows])
            low[rows], high[rows] = np.minimum(low[rows], b_low), np.maximum(high[rows], b_high)
            p[rows] = np.maximum(p[rows], b_p)
    return {"low": low, "high": high, "p_value": p, "widened": widened, "skew_p": skew_p(d)}
