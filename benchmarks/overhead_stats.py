"""The overhead benchmark's statistics and results: paired cycle ratios to TRL's GRPOTrainer (`ratio_estimate`,
a trimmed mean with Yuen's interval), the A/A noise floor, the JSON payload (`build_payload`, `resummarise` for
`--from-json`) and the plot."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from . import common
from .overhead_lockstep import lockstep_groups
from .overhead_workload import BASELINE, CONTROL, target_of


def cycle_log_ratios(runs: list[dict], cycle: int) -> list[float]:
    """log(a trainer's generation-cycle time / the baseline's same cycle in the same run), over every timed cycle
    of every run (`run["baseline_step_s"]`). A cycle holds one scoring call, so its time is the whole cost."""
    out = []
    for run in runs:
        a, b = run["step_s"], run["baseline_step_s"]
        for k in range(0, min(len(a), len(b)) - cycle + 1, cycle):
            out.append(math.log(sum(a[k : k + cycle]) / sum(b[k : k + cycle])))
    return out


TRIM = 0.2  # fraction of cycles dropped at each end
TIMED = ("Trainer.train() optimizer steps, generation replaced by fixed completions, a run's trainers in lockstep; "
         "time_ratio = exp(20%-trimmed mean over paired generation cycles of log(cycle time / TRL GRPOTrainer's same "
         "cycle in the same run)), Yuen's 95% interval; time_ms = mean step time, scoring included")  # fmt: skip


def ratio_estimate(log_ratios: list[float]) -> dict[str, Any]:
    """exp of the 20%-trimmed mean log ratio with Yuen's 95% interval (winsorized variance, n - 2g - 1 degrees of
    freedom): one step that the OS made twice as long moves a plain mean by log(2) / n (benchmarks/README.md)."""
    xs, n = sorted(log_ratios), len(log_ratios)
    g = int(TRIM * n)
    kept = xs[g : n - g]
    out = {"n_cycles": n, "ratio": math.exp(sum(kept) / len(kept)) if kept else None, "low": None, "high": None}
    if len(kept) >= 2:
        wins = [xs[g]] * g + kept + [xs[n - g - 1]] * g  # winsorized: the trimmed ends set to the nearest kept value
        centre = sum(wins) / n
        se = math.sqrt(sum((x - centre) ** 2 for x in wins) / (n - 1)) / ((1 - 2 * TRIM) * math.sqrt(n))
        half = common.t_quantile(len(kept) - 1, 0.05) * se
        out["low"], out["high"] = out["ratio"] * math.exp(-half), out["ratio"] * math.exp(half)
    return out


def noise_floor(control: dict[str, Any]) -> float | None:
    """The larger distance from 1 of the bounds of the A/A control's 95% interval; None without one."""
    low, high = control["time_ratio_ci95"]
    return None if low is None else max(high - 1.0, 1.0 - low)


def summarise(records: dict[str, list[dict]], targets: dict, labels: dict, cycle: int) -> dict[str, dict]:
    """Pool the runs of each trainer (one shape): paired ratios to TRL's GRPOTrainer, overall and per run."""
    out: dict[str, dict] = {}
    for name, runs in records.items():
        steps = [s for r in runs for s in r["step_s"]]
        est, target = ratio_estimate(cycle_log_ratios(runs, cycle)), targets.get(name)
        peaks = [r["activation_peak_bytes"] for r in runs if r.get("activation_peak_bytes") is not None]
        out[name] = {
            "label": labels[name], "time_ms": 1e3 * sum(steps) / len(steps), "timed_steps": len(steps),
            "time_ratio": est["ratio"], "time_ratio_ci95": [est["low"], est["high"]], "paired_cycles": est["n_cycles"],
            "time_ratio_per_run": [ratio_estimate(cycle_log_ratios([r], cycle))["ratio"] for r in runs],
            "step_s_per_run": [r["step_s"] for r in runs],  # the raw timings: for a look at the noise, `resummarise`
            "run_index": [r.get("run") for r in runs],
            "activation_peak_bytes": max(peaks) if peaks else None, "num_parameters": runs[0]["num_parameters"],
            "off_policy": runs[0]["off_policy"],
            "otb_energy_from_behaviour_forward": runs[0]["otb_energy_from_behaviour_forward"],
            "target_time_ratio": target, "meets_time_target": None if target is None else est["ratio"] <= target,
            "target_cleared_at_95": None if target is None or est["high"] is None else est["high"] <= target,
        }  # fmt: skip
    return out


def build_payload(args, device: str, dtype, state: dict) -> dict:
    """overhead_<device>.json: the settings, and per shape every trainer's paired ratio to TRL's GRPOTrainer."""
    targets, labels = {v.name: target_of(v) for v in state["runnable"]}, {v.name: v.label for v in state["runnable"]}
    shapes = {}
    for (vocab, length), (key, by_trainer) in zip(args.shape_list, state["records"].items()):
        if by_trainer[BASELINE]:
            results = summarise({n: r for n, r in by_trainer.items() if r}, targets, labels, args.cycle_steps)
            shapes[key] = {"vocab_size": vocab or None, "completion_length": length, "repeats": state["repeats"][key],
                           "noise_floor": noise_floor(results[CONTROL]) if CONTROL in results else None,
                           "run_seconds": state["run_seconds"][key], "run_steps": state["run_steps"][key],
                           "results": results}  # fmt: skip
    names = ("model", "shapes", "prompt_length", "num_generations", "steps_per_generation", "gradient_checkpointing",
             "cycle_steps", "group_size", "min_repeats", "max_repeats", "noise_target", "max_minutes",
             "seed")  # fmt: skip
    settings = {k: getattr(args, k) for k in names} | {
        "dtype": str(dtype).replace("torch.", ""), "per_device_train_batch_size": args.batch_size,
        "gradient_accumulation_steps": args.grad_accum, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "runs": [[v.name for v in g] for g in lockstep_groups(state["runnable"], args.group_size)],
        "timed": TIMED,
        "clock": "wall time, synchronized" if device == "cuda" else "the trainer thread's CPU time (time.thread_time)",
        "noise_floor": f"max distance from 1 of the 95% interval of {CONTROL} / {BASELINE}"}  # fmt: skip
    env = ("GLIBC_TUNABLES", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF")
    return {"benchmark": "overhead", "device": common.describe_device(device), "smoke": args.smoke,
            "command": common.command_line("benchmarks.overhead", args.argv),
            "environment": {k: os.environ[k] for k in env if k in os.environ}, "settings": settings,
            "baseline": BASELINE, "control": CONTROL,
            "variants": {v.name: {"method": v.method, "overrides": v.overrides} for v in state["runnable"]},
            "repeats_done": max(state["repeats"].values()), "stop_reason": state["stop_reason"],
            "wall_s": time.perf_counter() - state["started"], "shapes": shapes,
            "memory_kind": "cuda activation peak per timed step" if device == "cuda" else "not measured on CPU",
            }  # fmt: skip


def resummarise(payload: dict, command: str) -> dict:
    """`payload` (an earlier run's JSON) with every ratio, interval and floor recomputed from its raw step times by
    this checkout's estimator (`ratio_estimate`); nothing is trained."""
    for shape in payload["shapes"].values():
        res = shape["results"]
        base = res[BASELINE]
        if "run_index" not in base:  # written before --from-json: which runs pair up is not recorded
            raise SystemExit("--from-json: this JSON predates run_index (each run's index among its shape's runs)")
        records = {}
        for name, e in res.items():  # each of the trainer's runs, paired with the baseline's run of the same index
            records[name] = [dict(step_s=s, baseline_step_s=base["step_s_per_run"][i], run=i,
                                  **{k: e[k] for k in ("activation_peak_bytes", "num_parameters", "off_policy",
                                                       "otb_energy_from_behaviour_forward")})
                             for s, i in zip(e["step_s_per_run"], e["run_index"])]  # fmt: skip
        targets, labels = {n: e["target_time_ratio"] for n, e in res.items()}, {n: e["label"] for n, e in res.items()}
        shape["results"] = res = summarise(records, targets, labels, payload["settings"]["cycle_steps"])
        shape["noise_floor"] = noise_floor(res[CONTROL])
    from .report import overhead_markdown

    payload["summarised_by"], payload["settings"]["timed"] = command, TIMED
    payload["table"] = overhead_markdown(payload)
    return payload


def plot(payload: dict, path: Path) -> Path | None:
    """Ratio bars with 95% intervals per shape, the noise floor as a grey band, targets as red dashes."""
    if (plt := common.pyplot()) is None:
        return None
    shapes = payload["shapes"]
    size = (5 + 0.6 * len(next(iter(shapes.values()))["results"]) * len(shapes), 4.8)
    fig, axes = plt.subplots(1, len(shapes), figsize=size, squeeze=False)
    for ax, (key, shape) in zip(axes[0], shapes.items()):
        names, nf = list(shape["results"]), shape["noise_floor"] or 0.0
        res = [shape["results"][n] for n in names]
        values = [e["time_ratio"] for e in res]
        low, high = ([e["time_ratio_ci95"][i] or e["time_ratio"] for e in res] for i in (0, 1))
        ax.bar(range(len(names)), values, yerr=[[v - lo for v, lo in zip(values, low)],
               [hi - v for v, hi in zip(values, high)]], capsize=2,
               color=["tab:gray" if n in (BASELINE, CONTROL) else "tab:blue" for n in names])  # fmt: skip
        for i, e in enumerate(res):
            if e.get("target_time_ratio"):
                ax.hlines(e["target_time_ratio"], i - 0.4, i + 0.4, colors="tab:red", linestyles="--")
            ax.text(i, values[i], f"{values[i]:.3f}", ha="center", va="bottom", fontsize=7)
        ax.axhspan(1.0 - nf, 1.0 + nf, color="tab:gray", alpha=0.2, linewidth=0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(max(0.0, min(low + [1.0 - nf]) - 0.05), max(high + [1.06, 1.0 + nf]) + 0.03)  # the bars' tops
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{key}: time / TRL's, 95% CI (grey: noise floor +-{nf:.1%})", fontsize=9)
    fig.suptitle(f"trl-groupopt {payload['benchmark']} ({payload['device']['description']}); red: targets", fontsize=9)
    return common.save_figure(fig, path, 120)
