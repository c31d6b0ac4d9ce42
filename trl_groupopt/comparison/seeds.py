"""How many seeds a comparison runs: `--seeds N` (seeds 0..N-1), or `--seeds auto`: a pilot, then the total Stein's
two-stage rule gives for a 95% interval of +-2 points, then stop (docs/compare.md, "How many seeds"). Standard
library only."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import stats

AUTO = "auto"
PILOT_SEEDS = 8
MAX_SEEDS = 40
_H = f"{100 * stats.EQUIVALENCE_MARGIN:.0f}"
RULE = (
    "Stein's two-stage rule (Stein 1945, Ann. Math. Statist. 16:243): a pilot of n0 seeds gives each method's paired "
    f"sd s0; the total is N = max(n0, ceil((t(0.975, n0-1) * s0 / h)^2)) for the widest method, h = {_H} points, at "
    "most --max_seeds; each interval is mean(d over N seeds) +- t(0.975, n0-1) * s0 / sqrt(N). N depends on the "
    "pilot's spread alone, never on the differences seen, so the interval keeps its 95% coverage"
)


def keys(methods: Sequence[str], seeds: int) -> list[tuple[str, int]]:
    """Every (method, seed) of seeds 0..seeds-1, seed by seed (a stopped comparison has whole pairs first)."""
    return [(method, seed) for seed in range(seeds) for method in methods]


def plan(records: Sequence[Mapping[str, Any]], methods: Sequence[str], baseline: str, pilot: int, max_seeds: int,
         target: float = stats.EQUIVALENCE_MARGIN) -> dict[str, Any] | None:  # fmt: skip
    """The `--seeds auto` plan from the pilot's finished runs (seeds below `pilot`), or None until every pilot run
    has finished. {"rule", "pilot_seeds", "target_half_width", "max_seeds", "methods": {method: {"pilot_n",
    "pilot_sd", "needed"}}, "total", "capped"}."""
    after = {(r["method"], r["seed"]): r.get("accuracy_after") for r in records if "error" not in r}
    if any((m, s) not in after for m in methods for s in range(pilot)):
        return None
    rows = {}
    for method in (m for m in methods if m != baseline):
        ours = {s: after[(method, s)] for s in range(pilot)}
        theirs = {s: after[(baseline, s)] for s in range(pilot)}
        spread = stats.mean_ci(stats.paired_differences(ours, theirs))
        # no spread measured (fewer than 2 paired values): as many seeds as allowed
        needed = max_seeds if spread["std"] is None else stats.stein_total(spread["std"], spread["n"], target)
        rows[method] = {"pilot_n": spread["n"], "pilot_sd": spread["std"], "needed": needed}
    widest = max(row["needed"] for row in rows.values())
    return {"rule": RULE, "pilot_seeds": pilot, "target_half_width": target, "max_seeds": max_seeds,
            "methods": rows, "total": min(widest, max_seeds), "capped": widest > max_seeds}  # fmt: skip


def describe_plan(seed_plan: Mapping[str, Any]) -> str:
    """One line: the pilot's spreads and the planned total."""
    spreads = ", ".join(f"{m} {100 * r['pilot_sd']:.1f}" if r["pilot_sd"] is not None else f"{m} n/a"
                        for m, r in seed_plan["methods"].items())  # fmt: skip
    capped = f" (capped at --max_seeds {seed_plan['max_seeds']}: intervals wider than +-2 points)" if (
        seed_plan["capped"]) else ""  # fmt: skip
    return (f"pilot of {seed_plan['pilot_seeds']} seeds, paired sd (points) {spreads}: {seed_plan['total']} seeds in "
            f"all{capped}")  # fmt: skip


def drive(methods: Sequence[str], seeds: int | str, baseline: str, pilot: int, max_seeds: int,
          launch: Callable[[list[tuple[str, int]]], None],
          records: Callable[[], list[dict[str, Any]]]) -> dict[str, Any] | None:  # fmt: skip
    """Run the comparison's seeds with `launch(keys)` (it runs what is missing of `keys`): all N, or the pilot then
    the planned rest. Returns the plan of `--seeds auto` (None for `--seeds N`, or while the pilot is unfinished)."""
    if seeds != AUTO:
        launch(keys(methods, int(seeds)))
        return None
    launch(keys(methods, pilot))
    seed_plan = plan(records(), methods, baseline, pilot, max_seeds)
    if seed_plan is None:
        return None
    print(f"--seeds auto: {describe_plan(seed_plan)}", flush=True)
    if seed_plan["total"] > pilot:
        launch(keys(methods, seed_plan["total"]))
    return seed_plan
