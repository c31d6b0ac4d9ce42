"""How many seeds a comparison runs: `--seeds N` (seeds 0..N-1), or `--seeds auto`: a pilot, then the total Stein's
two-stage rule gives for an interval of +-1 point (half the "no difference" margin, so that verdict is within reach
when it is true), then stop (docs/compare.md, "How many seeds"). The pilot and cap a folder's plan was made with
are recorded in it (`SEEDS_FILE`): another pilot or cap would re-plan runs already judged. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..runfolder.checkpoints import read_json
from . import stats
from .runs import write_json

AUTO = "auto"
PILOT_SEEDS = 8
MAX_SEEDS = 40
#: A pilot's paired sd below this is planned from this (a pilot's spread can be 0 by chance: all its differences
#: equal; a zero sd would plan the pilot alone and give a zero-width interval).
SD_FLOOR = 0.01
#: DIR/seeds.json: `--pilot_seeds` and `--max_seeds` of a `--seeds auto` folder
SEEDS_FILE = "seeds.json"
_H = f"{100 * stats.PLAN_HALF_WIDTH:g}"
RULE = (
    "Stein's two-stage rule (Stein 1945, Ann. Math. Statist. 16:243): a pilot of n0 seeds gives each method's paired "
    f"sd s0 (at least {100 * SD_FLOOR:g} point); the total is N = max(n0, ceil((t(1 - a/2, n0-1) * s0 / h)^2)) for "
    f"the widest method, h = {_H} point (half the no-difference margin), a = {stats.ALPHA:g}/k for k methods "
    "against the baseline, at most --max_seeds; each t interval is mean(d over N seeds) +- t(1 - a/2, n0-1) * s0 / "
    "sqrt(N). N depends on the pilot's spread alone, never on the differences seen, so the interval keeps its "
    "coverage"
)


def keys(methods: Sequence[str], seeds: int) -> list[tuple[str, int]]:
    """Every (method, seed) of seeds 0..seeds-1, seed by seed (a stopped comparison has whole pairs first)."""
    return [(method, seed) for seed in range(seeds) for method in methods]


def family(methods: Sequence[str], baseline: str) -> int:
    """How many comparisons share the familywise error: the methods other than the baseline."""
    return max(1, sum(m != baseline for m in methods))


def plan(records: Sequence[Mapping[str, Any]], methods: Sequence[str], baseline: str, pilot: int, max_seeds: int,
         target: float = stats.PLAN_HALF_WIDTH) -> dict[str, Any] | None:  # fmt: skip
    """The `--seeds auto` plan from the pilot's finished runs (seeds below `pilot`), or None until every pilot run
    has finished. {"rule", "pilot_seeds", "target_half_width", "alpha", "sd_floor", "max_seeds", "methods":
    {method: {"pilot_n", "pilot_sd", "planned_sd", "needed"}}, "total", "capped"}."""
    after = {(r["method"], r["seed"]): r.get("accuracy_after") for r in records if "error" not in r}
    if any((m, s) not in after for m in methods for s in range(pilot)):
        return None
    alpha = stats.family_alpha(family(methods, baseline))
    rows = {}
    for method in (m for m in methods if m != baseline):
        ours = {s: after[(method, s)] for s in range(pilot)}
        theirs = {s: after[(baseline, s)] for s in range(pilot)}
        spread = stats.mean_ci(stats.paired_differences(ours, theirs))
        # no spread measured (fewer than 2 paired values): as many seeds as allowed
        planned = None if spread["std"] is None else max(spread["std"], SD_FLOOR)
        needed = max_seeds if planned is None else stats.stein_total(planned, spread["n"], target, alpha)
        rows[method] = {"pilot_n": spread["n"], "pilot_sd": spread["std"], "planned_sd": planned, "needed": needed}
    widest = max(row["needed"] for row in rows.values())
    return {"rule": RULE, "pilot_seeds": pilot, "target_half_width": target, "alpha": alpha, "sd_floor": SD_FLOOR,
            "max_seeds": max_seeds, "methods": rows, "total": min(widest, max_seeds),
            "capped": widest > max_seeds}  # fmt: skip


def reachable_spread(max_seeds: int, pilot: int, k: int, half: float = stats.EQUIVALENCE_MARGIN) -> float:
    """The largest paired sd at which Stein's interval over `max_seeds` seeds (a pilot of `pilot`, `k` methods) is
    +-`half` wide: above it, an interval at the cap is wider (`half` the margin: "no difference" out of reach)."""
    return half * math.sqrt(max_seeds) / stats.t_quantile(pilot - 1, stats.family_alpha(k))


def describe_cap(max_seeds: int, pilot: int, k: int) -> str:
    """One line, before anything trains: the paired spread the cap allows a "no difference" verdict at."""
    most = reachable_spread(max_seeds, pilot, k)
    planned = reachable_spread(max_seeds, pilot, k, stats.PLAN_HALF_WIDTH)
    return (f"at --max_seeds {max_seeds} (pilot {pilot}, {k} method(s) against the baseline) a 'no difference' "
            f"verdict needs a paired spread below {100 * most:.1f} points; the planned +-{_H} point needs one below "
            f"{100 * planned:.1f}")  # fmt: skip


def cap_warning(seed_plan: Mapping[str, Any], k: int) -> str | None:
    """After the pilot, where the cap leaves the intervals wider than the margin (no "no difference" verdict can
    come out, only a "better" or "worse" beyond that width): one line naming the fix, else None. Warned, and the
    comparison goes on: the pilot's runs are trained already, and a large difference can still be decided."""
    if not seed_plan["capped"]:
        return None
    widest = max((r for r in seed_plan["methods"].values() if r["planned_sd"] is not None),
                 key=lambda r: r["planned_sd"], default=None)  # fmt: skip
    if widest is None:
        return None
    half = stats.t_quantile(widest["pilot_n"] - 1, seed_plan["alpha"]) * widest["planned_sd"] / math.sqrt(
        seed_plan["max_seeds"])  # fmt: skip
    if half < stats.EQUIVALENCE_MARGIN:
        return None
    return (f"--max_seeds {seed_plan['max_seeds']} is too few at the pilot's paired sd of "
            f"{100 * widest['planned_sd']:.1f} points: the intervals will be about +-{100 * half:.1f} points, so "
            "'no difference' cannot come out and 'better'/'worse' only for a difference beyond that; raise "
            f"--max_seeds to {max(r['needed'] for r in seed_plan['methods'].values())} for the planned +-{_H} point "
            f"(k = {k})")  # fmt: skip


def describe_plan(seed_plan: Mapping[str, Any]) -> str:
    """One line: the pilot's spreads and the planned total."""
    spreads = ", ".join(f"{m} {100 * r['pilot_sd']:.1f}" if r["pilot_sd"] is not None else f"{m} n/a"
                        for m, r in seed_plan["methods"].items())  # fmt: skip
    capped = f" (capped at --max_seeds {seed_plan['max_seeds']}: intervals wider than +-{_H} point)" if (
        seed_plan["capped"]) else ""  # fmt: skip
    return (f"pilot of {seed_plan['pilot_seeds']} seeds, paired sd (points) {spreads}: {seed_plan['total']} seeds in "
            f"all{capped}")  # fmt: skip


def check_recorded(out: Path, seeds: int | str, pilot: int, max_seeds: int) -> str | None:
    """Why `--pilot_seeds`/`--max_seeds` differ from those DIR's `--seeds auto` plan was made with (DIR/seeds.json),
    in one line naming the fix, or None. Reads only (`record` writes)."""
    path = out / SEEDS_FILE
    if seeds != AUTO or not path.exists():
        return None
    made = read_json(path)
    if not isinstance(made, dict):
        return (f"{path} is damaged: delete it if {out}'s plan was made with --pilot_seeds {pilot} --max_seeds "
                f"{max_seeds} (this command writes it again), or use another --output_dir")  # fmt: skip
    wanted = {"pilot_seeds": pilot, "max_seeds": max_seeds}
    if differ := [f"--{k} {made.get(k)} there, {v} here" for k, v in wanted.items() if made.get(k) != v]:
        return (f"{path}: {out}'s seeds were planned otherwise ({'; '.join(differ)}): a new pilot or cap would re-plan "
                "runs already judged; pass " + " ".join(f"--{k} {made.get(k)}" for k in wanted) + ", or use another "
                "--output_dir")  # fmt: skip
    return None


def record(out: Path, seeds: int | str, pilot: int, max_seeds: int) -> None:
    """Record a `--seeds auto` folder's `--pilot_seeds` and `--max_seeds` in DIR/seeds.json (whole or absent)."""
    if seeds == AUTO and not (out / SEEDS_FILE).exists():
        write_json(out / SEEDS_FILE, {"pilot_seeds": pilot, "max_seeds": max_seeds})


def drive(methods: Sequence[str], seeds: int | str, baseline: str, pilot: int, max_seeds: int,
          launch: Callable[[list[tuple[str, int]]], None],
          records: Callable[[], list[dict[str, Any]]]) -> dict[str, Any] | None:  # fmt: skip
    """Run the comparison's seeds with `launch(keys)` (it runs what is missing of `keys`): all N, or the pilot then
    the planned rest. Returns the plan of `--seeds auto` (None for `--seeds N`, or while the pilot is unfinished)."""
    if seeds != AUTO:
        launch(keys(methods, int(seeds)))
        return None
    k = family(methods, baseline)
    print(f"--seeds auto: {describe_cap(max_seeds, pilot, k)}", flush=True)
    launch(keys(methods, pilot))
    seed_plan = plan(records(), methods, baseline, pilot, max_seeds)
    if seed_plan is None:
        return None
    print(f"--seeds auto: {describe_plan(seed_plan)}", flush=True)
    if warning := cap_warning(seed_plan, k):
        print(f"--seeds auto: warning: {warning}", flush=True)
    if seed_plan["total"] > pilot:
        launch(keys(methods, seed_plan["total"]))
    return seed_plan
