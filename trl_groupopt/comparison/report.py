"""compare.md and compare.png of `trl-groupopt compare`, from compare.json's content alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import stats
from .runs import reason


def _points(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}"


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _not_counted(acted: dict[str, Any]) -> str:
    """The optimizer steps the count leaves out, as the mechanism report says them (methods/mechanism.py)."""
    n = acted.get("undefined") or 0
    return f"; not counted: {n} step{'s' * (n != 1)} on which its metric was undefined" if n else ""


def _level(result: dict[str, Any]) -> str:
    """The level of the comparisons' intervals (1 - 0.05 / k)."""
    levels = [row["level"] for row in result["comparisons"] if row.get("level") is not None]
    return f"{levels[0]:.1%}" if levels else f"{1 - stats.ALPHA:.0%}"


def _acted(acted: dict[str, Any] | None) -> str:
    if not acted or not acted.get("steps"):
        return f"not measured{_not_counted(acted)}" if acted and acted.get("undefined") else "n/a"
    share = f"{acted['acted'] / acted['steps']:.0%}{_not_counted(acted)}"
    return f"{acted['acted']} of {acted['steps']} optimizer steps ({share}): {acted['what']}"


def describe(record: dict[str, Any]) -> str:
    """One line on a finished run, for the progress log."""
    acted = record.get("acted")
    share = f", acted on {acted['acted']} of {acted['steps']} optimizer steps{_not_counted(acted)}" if acted and (
        acted["steps"]) else ""  # fmt: skip
    none = f", no learning signal on {n} of {record['steps']} steps" if (n := record.get("no_signal_steps")) else ""
    return (f"accuracy {_percent(record['accuracy_before'])} -> {_percent(record['accuracy_after'])}{share}{none}, "
            f"{record['wall_s']:.0f} s wall, {record['cpu_s']:.0f} s CPU")  # fmt: skip


def _no_signal(runs: list[dict[str, Any]], methods: list[str]) -> list[str]:
    """The line on the steps without a learning signal (trl_groupopt/trainer/learning_signal.py), when any run had
    them: a method whose runs learned from nothing is no evidence about the method."""
    counts = {m: [(r.get("no_signal_steps") or 0, r.get("steps") or 0) for r in runs if r["method"] == m]
              for m in methods}  # fmt: skip
    if not any(n for pairs in counts.values() for n, _ in pairs):
        return []
    said = "; ".join(f"{m} {sum(n for n, _ in p)} of {sum(t for _, t in p)}" for m, p in counts.items() if p)
    return ["", f"Optimizer steps without a learning signal (every group's rewards equal), over all runs: {said}."]


def markdown(result: dict[str, Any]) -> str:
    """The comparison table, each method's accuracy, the power notes, the rule and the cost."""
    s = result["settings"]
    ok = [r for r in result["runs"] if "error" not in r]
    lines = [
        f"# {', '.join(m for m in s['methods'] if m != s['baseline'])} vs {s['baseline']}",
        "",
        f"`{result['command']}`",
        "",
        f"| method | vs | seeds | difference (points) | {_level(result)} interval | verdict | decided by | p "
        "(adjusted) | mechanism acted |",
        "|---|---|---:|---:|---|---|---|---|---|",
    ]
    for row in result["comparisons"]:
        low, high = row["ci95"]
        interval = "n/a" if low is None else f"[{_points(low)}, {_points(high)}]"
        note = f" ({row['note']})" if row.get("note") else ""
        p = "n/a" if row.get("p_value") is None else f"{row['p_value']:.3g} ({row['p_adjusted']:.3g})"
        lines.append(f"| {row['method']} | {row['baseline']} | {row['n']} | {_points(row['difference'])} | "
                     f"{interval} | **{row['verdict']}**{note} | {row.get('procedure', 't')} | {p} | "
                     f"{_acted(row['acted'])} |")  # fmt: skip
    if rows := result["comparisons"]:
        k = rows[0].get("family", 1)
        lines += ["", f"{k} method(s) against {s['baseline']}: each interval at {_level(result)}, the "
                  f"{rows[0].get('correction', stats.CORRECTION)} correction, so all {k} verdicts hold together at "
                  f"{1 - stats.ALPHA:.0%} (p: the paired test of no difference, adjusted: times {k}). Decided by: t "
                  "(Student), stein (Stein's two-stage t), bootstrap-t (the studentized bootstrap reached further "
                  "than the t interval: skewed differences)."]  # fmt: skip
    lines += ["", "| method | runs | held-out accuracy before | after (mean [95% CI]) | wall s / run | CPU s / run |",
              "|---|---:|---:|---|---:|---:|"]  # fmt: skip
    for method in s["methods"]:
        rs = [r for r in ok if r["method"] == method]
        after = stats.mean_ci([r["accuracy_after"] for r in rs])
        ci = "" if after["low"] is None else f" [{_percent(after['low'])}, {_percent(after['high'])}]"
        lines.append(f"| {method} | {len(rs)} | {_percent(stats.mean([r['accuracy_before'] for r in rs]))} | "
                     f"{_percent(after['mean'])}{ci} | {stats.mean([r['wall_s'] for r in rs]) or 0:.0f} | "
                     f"{stats.mean([r['cpu_s'] for r in rs]) or 0:.0f} |")  # fmt: skip
    lines += _no_signal(ok, s["methods"])
    if plan := result.get("seed_plan"):
        spreads = ", ".join(f"{m} {_points(r['pilot_sd']).lstrip('+')} points over {r['pilot_n']} seeds "
                            f"(needs {r['needed']})" for m, r in plan["methods"].items())  # fmt: skip
        capped = (f" (capped at --max_seeds {plan['max_seeds']}: the intervals are wider than "
                  f"+-{100 * plan['target_half_width']:g} point)" if plan["capped"] else "")  # fmt: skip
        lines += ["", f"Seeds: `--seeds auto`, {plan['pilot_seeds']} pilot seeds; the pilot's paired sd: {spreads}; "
                  f"planned total **{plan['total']} seeds**{capped}. Rule: {plan['rule']}."]  # fmt: skip
    notes = [f"- {row['method']}: {row['power']['text']}." for row in result["comparisons"] if row.get("power")]
    if notes:
        lines += ["", "Power (from the observed paired spread):", "", *notes]
    lines += [
        "",
        f"Held-out greedy accuracy on {s['eval_examples']} prompts every run shares; the difference is the method's "
        "accuracy after training minus the baseline's with the same seed, in points. "
        f"Verdict rule: {result['verdict_rule']}.",
    ]
    launcher = result.get("launcher") or {}
    if launcher.get("launcher") == "slurm":
        lines += ["", "Runs: one Slurm job each (job ids, logs and resources in DIR/slurm/jobs.jsonl)."]
    elif devices := sorted({",".join(r["devices"]) for r in ok if r.get("devices")}):
        lines += ["", f"Runs: on devices {'; '.join(devices)} (each run's in runs.jsonl, `devices`)."]
    if failed := [r for r in result["runs"] if "error" in r]:
        lines += ["", "Failed runs (each runs again on the next invocation):", "",
                  *(f"- {r['method']}-{r['seed']}: {reason(r)}" for r in failed)]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_plot(result: dict[str, Any], path: Path) -> Path:
    """One row per method: each seed's paired difference (dots), the mean and its interval (bar: all methods together at 95%), the +-2-point
    band of "no difference"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["comparisons"]
    fig, ax = plt.subplots(figsize=(7.5, 1.0 + 0.7 * max(1, len(rows))))
    margin = 100 * stats.EQUIVALENCE_MARGIN
    ax.axvspan(-margin, margin, color="0.9", label=f"no difference band (+-{margin:.0f} points)")
    ax.axvline(0.0, color="0.5", linewidth=0.8)
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        diffs = [100 * d for d in row["per_seed"] if d is not None]
        ax.scatter(diffs, [y + 0.15] * len(diffs), s=14, color="tab:blue", alpha=0.6, zorder=3)
        if row["difference"] is not None:
            low, high = row["ci95"]
            mean = 100 * row["difference"]
            err = [[mean - 100 * low], [100 * high - mean]] if low is not None else None
            ax.errorbar([mean], [y - 0.1], xerr=err, fmt="o", color="black", capsize=4, zorder=4)
        ax.text(1.01, y, row["verdict"], transform=ax.get_yaxis_transform(), va="center", fontsize=9)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['method']} - {r['baseline']} (n={r['n']})" for r in reversed(rows)])
    ax.set_xlabel("held-out accuracy difference, points (dots: seeds; bar: mean, familywise 95% interval)")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
