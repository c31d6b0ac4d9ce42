"""Markdown tables for the results page, generated from the committed JSON results (no hand-typed numbers).

    python -m benchmarks.report                      # benchmarks/results/*.json -> *.md, spliced into docs/results.md
    python -m benchmarks.report --results-dir outputs/bench               # tables only, into that folder
    python -m benchmarks.report --results-dir outputs/bench --page P.md   # and spliced into P.md

Writes, for each input that exists: `overhead_cpu.md` (from `overhead_cpu.json`), `overhead_cuda.md` (from
`overhead_cuda.json`), `overhead_cpu_estimators.md` (from `overhead_cpu_estimators.json`, the estimator rows),
`sample_efficiency.md` (from `sample_efficiency.json`), `claims.md` (from `claims.json`), `power.md` (from
`power.json`) and `stress.md` (from `stress.json`). Then each block of the page between
`<!-- BEGIN GENERATED: benchmarks/results/NAME.md -->` and `<!-- END GENERATED -->` is replaced by that file. The
page is `--page` (`--readme` is an alias), by default `docs/results.md` when the tables are the committed ones
(`--results-dir` is `benchmarks/results/`); tables written elsewhere are spliced nowhere unless `--page` names a
page, so a scratch run never overwrites the committed page.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from . import common
from .power import power_markdown
from .stress import claims_markdown

#: The page whose generated blocks hold the committed tables.
DEFAULT_PAGE = common.REPO / "docs" / "results.md"


def overhead_markdown(payload: dict[str, Any]) -> str:
    """One table per shape: each trainer's step time and paired ratio to TRL's GRPOTrainer, its target and verdict."""
    s = payload["settings"]
    tunables = payload.get("environment", {}).get("GLIBC_TUNABLES")
    lines = [
        f"Device: {payload['device']['description']} (torch {payload['device'].get('torch')}, "
        f"trl {payload['device'].get('trl')}); model `{s['model']}` ({s['dtype']}), prompts of {s['prompt_length']} "
        f"tokens, {s['per_device_train_batch_size']} sequences per micro-batch (groups of {s['num_generations']}), "
        f"{s['gradient_accumulation_steps']} micro-batches per step, {s['steps_per_generation']} per generation "
        f"(off-policy); every trainer in lockstep, {s['warmup_steps']} warm-up + {s['timed_steps']} timed steps per "
        f"run; {payload['repeats_done']} repeats ({payload['stop_reason']}); total {payload['wall_s'] / 60:.1f} min.",
        "",
        "Ratio: geometric mean over paired generation cycles of (trainer's cycle time / TRL GRPOTrainer's same "
        + (
            "cycle), 20%-trimmed, with Yuen's 95% interval."
            if "trimmed" in s.get("timed", "")
            else "cycle), with its 95% interval."
        )
        + " Noise floor: how far from 1 the interval of `trl_grpo_again` (TRL's "
        "GRPOTrainer a second time, the A/A control) reaches.",
        "",
    ]
    for shape in payload["shapes"].values():
        nf = shape["noise_floor"]
        vocab = shape["vocab_size"] or "task (~70)"
        lines += [
            f"**Vocabulary {vocab}, completions up to {shape['completion_length']} tokens** — noise floor: "
            + (f"±{nf:.1%}" if nf is not None else "n/a (too few cycles)")
            + (f"; {shape['repeats']} repeat(s)" if "repeats" in shape else "")
            + (
                f"; on the process's CPU time ±{shape['noise_floor_cpu_clock']:.1%}"
                if shape.get("noise_floor_cpu_clock") is not None
                else ""
            ),
            "",
            "| trainer | step time (ms) | x TRL GRPOTrainer [95% CI] | paired cycles | target | |",
            "|---|---:|---|---:|---:|---|",
        ]
        for name, e in shape["results"].items():
            low, high = e["time_ratio_ci95"]
            ratio = f"{e['time_ratio']:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None else "")
            if e.get("time_ratio_cpu_clock") is not None:  # CUDA: the same ratio on the process's CPU time
                ratio += f"; CPU time {e['time_ratio_cpu_clock']:.3f}"
            target = e["target_time_ratio"]
            verdict = ""
            if target is not None:
                verdict = "within" if e["meets_time_target"] else "**over**"
                if e["meets_time_target"] and not e["target_cleared_at_95"]:
                    verdict += " (point estimate; interval reaches above)"
            lines.append(
                f"| `{name}` {e['label']} | {e['time_ms']:.1f} | {ratio} | {e['paired_cycles']} | "
                + (f"<= {target:.2f}" if target else "reported")
                + f" | {verdict} |"
            )
        lines.append("")
    if payload.get("not_available"):
        lines.append(
            "Not available in the measured checkout: "
            + "; ".join(f"`{k}` ({v.removeprefix('not available: ')})" for k, v in payload["not_available"].items())
        )
        lines.append("")
    command = payload["command"]
    if tunables:
        command = f"GLIBC_TUNABLES={tunables} {command}"
    lines.append(f"Command: `{command}`. Generated by `python -m benchmarks.report`.")
    if payload.get("summarised_by"):  # the ratios recomputed from the raw step times by a later estimator
        lines.append(f"Ratios recomputed from its raw step times by `{payload['summarised_by']}`.")
    return "\n".join(lines) + "\n"


def stress_markdown(payload: dict[str, Any]) -> str:
    """Per regime x value x configuration: final accuracy, gain and the mechanism metric (mean [95% CI])."""

    def ci(stats, pct=True):
        if not stats or stats.get("mean") is None:
            return "n/a"
        f = (lambda x: f"{x:.1%}") if pct else (lambda x: f"{x:.3g}")
        return f(stats["mean"]) + (f" [{f(stats['low'])}, {f(stats['high'])}]" if stats.get("low") is not None else "")

    lines = [
        "| regime | value | configuration | seeds | final accuracy | accuracy gain | mechanism metric (mean over training) |",
        "|---|---:|---|---:|---|---|---|",
    ]
    for regime, by_value in payload["summary"].items():
        for value, by_config in sorted(by_value.items(), key=lambda kv: float(kv[0])):
            for name, e in by_config.items():
                mech = "; ".join(f"`{k}` {ci(m, pct=False)}" for k, m in e["mechanism"].items())
                lines.append(
                    f"| {regime} | {value} | `{name}` | {len(e['seeds'])} | {ci(e['final_accuracy'])} | "
                    f"{ci(e['accuracy_gain'])} | {mech or 'n/a'} |"
                )
    return "\n".join(lines) + "\n"


def sample_efficiency_markdown(payload: dict[str, Any]) -> str:
    """Per method: initial and final held-out accuracy, seeds reaching GRPO's final accuracy, Jitter2, reward."""

    def ci(stats, fmt="{:.1%}"):
        if not stats or stats.get("mean") is None:
            return "n/a"
        return fmt.format(stats["mean"]) + (f" ± {fmt.format(stats['ci95'])}" if stats.get("ci95") is not None else "")

    summary, s = payload["summary"], payload["settings"]
    threshold = summary["threshold_accuracy"]
    shared = s["shared_config"]
    lines = [
        f"Device: {payload['device']['description']} (torch {payload['device'].get('torch')}, trl "
        f"{payload['device'].get('trl')}); {s['max_steps']} optimizer steps per run, {s['seeds']} seeds, "
        f"{shared['per_device_train_batch_size']} sequences per micro-batch x {shared['gradient_accumulation_steps']} "
        f"micro-batches per step, {shared['steps_per_generation']} micro-batches per generation (off-policy), "
        f"learning rate {shared['learning_rate']:g} ({shared['lr_scheduler_type']}); held-out greedy accuracy on "
        f"{s['num_eval']} prompts; ± is the 95% Student-t interval over seeds; {payload['wall_s'] / 60:.0f} min with "
        f"{s['workers']} workers.",
        "",
        "| method | N | accuracy at step 0 | final accuracy | runs reaching GRPO's final accuracy"
        + (f" ({threshold:.1%})" if threshold is not None else "")
        + " | Jitter2 of the reward curve (DFPO Eq. 20) | final train reward |",
        "|---|---:|---|---|---|---|---|",
    ]
    for e in summary["methods"].values():
        reached = e.get("steps_to_threshold")
        lines.append(
            f"| {e['label']} | {e['num_generations']} | {ci(e['initial_accuracy'])} | {ci(e['final_accuracy'])} | "
            + (f"{reached['reached']}/{reached['of']}" if reached else "n/a")
            + f" | {ci(e['jitter2_reward'], '{:.3f}')} | {ci(e['final_train_reward'], '{:.2f}')} |"
        )
    lines += ["", f"Command: `{payload['command']}`. Generated by `python -m benchmarks.report`."]
    return "\n".join(lines) + "\n"


_GENERATED = re.compile(
    r"(<!-- BEGIN GENERATED: benchmarks/results/([\w.]+\.md) -->\n)(.*?)(<!-- END GENERATED -->)", re.S
)


def splice_page(page: Path, results_dir: Path) -> list[str]:
    """Replace each generated block of `page` by the current file it names; returns the names replaced."""
    replaced = []

    def fill(match: re.Match) -> str:
        source = results_dir / match.group(2)
        if not source.exists():
            return match.group(0)
        replaced.append(match.group(2))
        return match.group(1) + source.read_text().rstrip() + "\n" + match.group(4)

    page.write_text(_GENERATED.sub(fill, page.read_text()))
    return replaced


def write_tables(results_dir: Path) -> list[Path]:
    """Each markdown table whose JSON is in `results_dir`, written beside it."""
    tables = [
        ("overhead_cpu.json", "overhead_cpu.md", overhead_markdown),
        ("overhead_cuda.json", "overhead_cuda.md", overhead_markdown),
        ("overhead_cpu_estimators.json", "overhead_cpu_estimators.md", overhead_markdown),
        ("sample_efficiency.json", "sample_efficiency.md", sample_efficiency_markdown),
        ("claims.json", "claims.md", claims_markdown),
        ("power.json", "power.md", power_markdown),
        ("stress.json", "stress.md", stress_markdown),
    ]
    written = []
    for source, target, render in tables:
        if (results_dir / source).exists():
            (results_dir / target).write_text(render(json.loads((results_dir / source).read_text())))
            written.append(results_dir / target)
    return written


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description="Markdown tables from the benchmark JSON files, spliced into the "
                                     "results page's generated blocks.")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    parser.add_argument("--page", "--readme", dest="page", type=Path, default=None,
                        help="Splice the tables into this page's generated blocks (default: docs/results.md for the "
                        "committed benchmarks/results/, no page for another --results-dir).")  # fmt: skip
    args = parser.parse_args(argv)
    if args.page is not None and not args.page.is_file():
        parser.error(f"--page {args.page}: no such file")
    written = write_tables(args.results_dir)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"nothing to do: no overhead_cpu.json, overhead_cuda.json, sample_efficiency.json, claims.json, "
              f"power.json or stress.json in {args.results_dir}")  # fmt: skip
    page = args.page
    if page is None and args.results_dir.resolve() == common.DEFAULT_OUTPUT_DIR.resolve():
        page = DEFAULT_PAGE if DEFAULT_PAGE.is_file() else None
        if page is None:
            print(f"no {DEFAULT_PAGE.relative_to(common.REPO)}: no page spliced")
    if page is not None:
        print(f"{page}: replaced {splice_page(page, args.results_dir) or 'no block'}")
    return written


if __name__ == "__main__":
    main()
