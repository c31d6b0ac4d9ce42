"""The one runner of the training benchmarks: the stress grid, the claims grid (`--claims`) and sample efficiency
(`--sample-efficiency`), `GRIDS`. A run trains a configuration (`CONFIGS`, `SE_CONFIGS`) with its regime's knob
(`REGIMES`) through the library's runner (`trl_groupopt.comparison.runs`: keyed runs files that the same command resumes);
`--from-runs FILE` rebuilds the JSON and the plot without training. See benchmarks/README.md.

    python -m benchmarks.stress --claims --from-runs benchmarks/results/claims_runs.jsonl  # rebuild, no training
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, NamedTuple

from trl_groupopt import METHODS
from trl_groupopt.cli.defaults import DEMO_DEFAULTS
from trl_groupopt.comparison import stats
from trl_groupopt.comparison.runs import Grid, Runs, pending, read_runs, run_grid, settings_conflict
from trl_groupopt.data.offline import VARIANTS as TASKS

from . import common

GSPO = dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, loss_type="grpo")  # GSPO v2 5.1
TRL = "trl"  # a configuration's method: TRL's own GRPOConfig and GRPOTrainer


class Config(NamedTuple):
    """A registry method (or `TRL`) and its config overrides, applied after the regime's settings."""

    method: str
    overrides: dict[str, Any]
    label: str


#: Besides each registered method at its defaults. The paper's epsilon (0.2) left ECHO's R unclipped at staleness
#: 16: `echo_step_tight` (not a paper setting, no claim) shows the mechanism acting. `ctpo_otb`: CTPO on OTB's baseline.
VARIANTS: dict[str, Config] = {
    "gspo": Config("grpo", GSPO, "GSPO (base trainer, sequence-level IS)"),
    "echo": Config("echo", {"batch_ratio_scope": "micro_batch"}, "ECHO, micro-batch scope"),
    "echo_step": Config("echo", {"batch_ratio_scope": "step"}, "ECHO, step scope"),
    "echo_step_tight": Config("echo", {"batch_ratio_scope": "step", "batch_epsilon": 0.01},
                              "ECHO, step scope, batch clip 1 +- 0.01"),
    "ctpo_geomean": Config("ctpo", {"ctpo_ratio_mode": "geomean"}, "CTPO, geometric-mean prefix ratio"),
    "dfpo": Config("dfpo", {"dfpo_transform": "min_replace"}, "DFPO min_replace"),
    "dfpo_orth_proj": Config("dfpo", {"dfpo_transform": "orth_proj"}, "DFPO orth_proj (all tokens)"),
    "dfpo_orth_proj_unclipped": Config("dfpo", {"dfpo_transform": "orth_proj", "dfpo_orthogonal_over": "unclipped"},
                                       "DFPO orth_proj, unclipped"),
    "ctpo_otb": Config("ctpo", {"advantage_estimator": "otb"}, "CTPO with OTB's token baseline"),
}  # fmt: skip
DEFAULTS = {name: Config(name, {}, spec.display_name) for name, spec in METHODS.items()}
CONFIGS: dict[str, Config] = DEFAULTS | VARIANTS
#: Sample efficiency: TRL's GRPOTrainer for GRPO and GSPO, the other registered methods at their defaults, DFPO's two
#: transforms, and TRL's GRPO at N = 16 (4x the samples at equal prompts: OTB's claim of a small-N baseline).
SE_CONFIGS: dict[str, Config] = {
    "grpo": Config(TRL, {}, "TRL GRPO"), "gspo": Config(TRL, GSPO, "TRL GSPO"),
    **{name: config for name, config in DEFAULTS.items() if name not in ("grpo", "dfpo")},
    "dfpo_min_replace": Config("dfpo", {"dfpo_transform": "min_replace"}, "DFPO min_replace"),
    "dfpo_orth_proj": Config("dfpo", {"dfpo_transform": "orth_proj"}, "DFPO orth_proj"),
    "grpo_n16": Config(TRL, {"num_generations": 16}, "TRL GRPO (N=16)"),
}  # fmt: skip


def _probe(micro_batches: int, learning_rate_scale: int, configs: list[str]) -> dict[str, Any]:
    """A regime of ECHO's batch-clip probe: staleness 16 and 32 at `learning_rate_scale` x the demo's rate."""
    return {"kind": "staleness", "knob": f"optimizer steps per generation ({micro_batches} micro-batches of "
            f"{16 // micro_batches} per step, learning rate x{learning_rate_scale})", "values": [16, 32],
            "micro_batches": micro_batches, "learning_rate_scale": learning_rate_scale, "configs": configs,
            "probe": "echo"}  # fmt: skip


# regime -> the knob it varies (`kind`, default its name), its values, and the configurations run at every value.
REGIMES: dict[str, dict[str, Any]] = {
    "staleness": {"knob": "optimizer steps per generation (2 micro-batches of 8 per step)", "values": [1, 4, 16],
                  "micro_batches": 2,  # per optimizer step, so ECHO's "step" and "micro_batch" scopes differ
                  "configs": ["grpo", "gspo", "echo", "echo_step", "echo_step_tight", "ctpo", "ctpo_geomean", "dfpo",
                              "dfpo_orth_proj", "dfpo_orth_proj_unclipped", "grpo_fix"]},
    "group_size": {"knob": "completions per prompt N (16 sequences per micro-batch)", "values": [2, 4, 8, 16],
                   "configs": ["grpo", "otb", "gspo", "dfpo"]},
    "long": {"knob": "8-12 operations on operands 1-20, completions of 71-143 tokens, long-chain policy, 4 optimizer "
             "steps per generation", "values": [4], "configs": ["grpo", "gspo", "otb", "ctpo", "echo", "dfpo", "ctpo_otb"]},
    # ECHO's batch clip at the paper's epsilon where R could leave [0.8, 1.2]: 32 updates per rollout, 3x and 10x
    # the learning rate, 8 micro-batches of 2 (the "step" scope's R does not change with the split). Claims grid only.
    "echo_probe_lr1": _probe(2, 1, ["echo", "echo_step", "grpo"]),
    "echo_probe_lr3": _probe(2, 3, ["echo", "echo_step", "grpo"]),
    "echo_probe_lr10": _probe(2, 10, ["echo", "echo_step", "grpo"]),
    "echo_probe_mb8_lr1": _probe(8, 1, ["echo"]),
    "echo_probe_mb8_lr10": _probe(8, 10, ["echo"]),
    "sample_efficiency": {"kind": "staleness", "knob": "4 optimizer steps per generation (2 micro-batches of 16)",
                          "values": [4], "configs": list(SE_CONFIGS), "table": SE_CONFIGS},
}  # fmt: skip
_NAMED = {CONFIGS[c].method for spec in REGIMES.values() if "table" not in spec for c in spec["configs"]}
for _regime in ("staleness", "group_size", "long"):  # a method no regime names (a new one): in each, at its defaults
    REGIMES[_regime]["configs"] += [name for name in METHODS if name not in _NAMED]
_LONG = dict(long_completion_length=TASKS["long"].max_new_tokens, long_learning_rate=1e-5)
#: Per grid: its regimes, seeds, the settings every run records (budget, task size; the claims', where a claim is
#: decided: 64 steps, 200 held-out prompts) and its smoke cells (regime -> values, configurations).
GRIDS: dict[str, dict[str, Any]] = {
    "stress": dict(regimes=["staleness", "group_size", "long"], seeds=5,
                   settings=dict(max_steps=16, num_train=1000, num_eval=64, grad_accum=1, **_LONG),
                   smoke={"staleness": ([1], ["grpo", "echo"]), "group_size": ([2], ["otb"]), "long": ([1], ["ctpo"])}),
    "claims": dict(regimes=list(REGIMES)[:-1], seeds=None,
                   settings=dict(max_steps=64, num_train=1000, num_eval=200, grad_accum=1, **_LONG)),
    "sample_efficiency": dict(regimes=["sample_efficiency"], seeds=3, smoke={"sample_efficiency": ([4], ["grpo", "otb"])},
                              settings=dict(max_steps=100, num_train=2000, num_eval=200, grad_accum=2, eval_every=10)),
}  # fmt: skip
SMOKE = dict(max_steps=2, num_train=128, num_eval=8, long_completion_length=48, eval_every=2)  # where a grid has it
GRID_REGIMES = GRIDS["stress"]["regimes"]
SMOKE_CLAIMS, SMOKE_PROBE = ("echo_off_policy", "ctpo_long"), ("echo_probe_lr10", 16)  # --claims --smoke, 1 seed
#: The metrics summarised per method (those its runs logged), from its spec: the keys its `Mechanism` reads and
#: quotes, its headline metric, then the token clip's share that the shared loss logs for every method.
MECHANISM_METRICS = {name: tuple(dict.fromkeys((*(spec.mechanism.watched_keys if spec.mechanism else ()),
                                                spec.headline_metric, "clip_ratio/region_mean")))
                     for name, spec in METHODS.items()}  # fmt: skip
#: Logged keys kept per optimizer step (every key starting with one of these), besides reward, entropy and length:
#: the namespaces (`<prefix>/`) of every method's summarised metrics.
MECHANISM_PREFIXES = tuple(sorted({key.split("/")[0] + "/" for keys in MECHANISM_METRICS.values() for key in keys
                                   if "/" in key}))  # fmt: skip

# ------------------------------------------------------------------------------------------------ claims as data
#: Each paper's claim, one row of data (`claims.jsonl`): id, paper, claim, regime, value, config, baseline (None: a
#: within-run mechanism claim), outcome (`outcome_of`), better (+1: larger is the claim), probe, and seeds: its stage-1
#: and stage-2 seeds (`CLAIM_SEEDS`, planned by `benchmarks.power`).
_ROWS = [json.loads(line) for line in Path(__file__).with_name("claims.jsonl").read_text().splitlines() if line]
CLAIMS: tuple[dict[str, Any], ...] = tuple({k: v for k, v in row.items() if k != "seeds"} for row in _ROWS)
CLAIM_SEEDS: dict[str, tuple[int, int | None]] = {row["id"]: tuple(row["seeds"]) for row in _ROWS}
PILOT_SEEDS = 8  # seeds 0-7 of every claim cell: the pilot whose paired sd sized each claim (`benchmarks.power`)
PROBE_SEEDS = 3  # per probe cell: the probe measures R's range, not accuracy
#: A probed mechanism: the metric whose range the probe reports (its per-step extremes: `record_extremes`), and extra
#: (regime, value) -> seeds cells where its configurations also run (ECHO's claims were first tested at staleness 16,
#: where the clip never acted).
PROBES = {"echo": {"metric": "echo/batch_ratio", "cells": {("staleness", 16): PILOT_SEEDS}}}
CLAIM_VERDICTS = {stats.BETTER: "reproduced", stats.WORSE: "not reproduced", stats.NO_DIFFERENCE: "not reproduced",
                  stats.INCONCLUSIVE: "inconclusive", stats.NOT_RUN: "not run"}  # fmt: skip
VERDICT_RULE = (
    "the rule of `trl-groupopt compare` (trl_groupopt.comparison.stats), with d = config - baseline paired by seed (for a "
    "mechanism claim without baseline, the within-run log ratio) and the claimed direction as better: reproduced: "
    "the 95% interval of mean d excludes 0 on the claimed side; not reproduced: it excludes 0 on the other side, or "
    f"(accuracy outcomes) lies inside +-{stats.EQUIVALENCE_MARGIN:.0%}; inconclusive otherwise, and whenever both "
    f"config and baseline end at <= {stats.FLOOR:.0%} accuracy (floor effect) or the method's mechanism acted on "
    "none of the claim's optimizer steps (the regime does not test it)"
)
RUNNING = "running"  # a claim whose planned seeds have not all run yet: no verdict
STAGE_RULE = (
    "each claim is decided on its first `seeds` seeds (stage 1, `CLAIM_SEEDS`, sized by the power analysis); a claim "
    "inconclusive at stage 1 for lack of precision (not the floor, not an idle mechanism) whose plan has a stage 2 "
    "runs seeds up to its stage-2 count and is decided on those; no third stage. A row with fewer seeds than "
    f'planned has no verdict yet: "{RUNNING}", with how many of its planned seeds have run and the interval so far'
)


# ------------------------------------------------------------------------------------------------ one run
def config_of(regime: str, name: str) -> Config:
    return REGIMES[regime].get("table", CONFIGS)[name]


def kind_of(regime: str) -> str:
    return REGIMES[regime].get("kind", regime)


def run_settings(regime: str, value: int, config_name: str, seed: int, settings: dict[str, Any],
                 output_dir: str) -> dict[str, Any]:  # fmt: skip
    """The config kwargs of one run: the demo's with the run's budget, the regime's knob, then the configuration's
    overrides (`num_generations` grows the micro-batch: the same prompts per micro-batch)."""
    spec, split = REGIMES[regime], REGIMES[regime].get("micro_batches", 1)
    accumulation = settings["grad_accum"] * split  # the same sequences per step in `split` micro-batches
    kwargs = {**DEMO_DEFAULTS, "output_dir": output_dir, "max_steps": settings["max_steps"], "logging_steps": 1,
              "seed": seed, "use_cpu": settings["device"] == "cpu", "dataloader_num_workers": 0,
              "model_init_kwargs": {"dtype": "float32"}, "gradient_accumulation_steps": accumulation,
              "per_device_train_batch_size": DEMO_DEFAULTS["per_device_train_batch_size"] // split,
              "steps_per_generation": value * accumulation}  # fmt: skip
    if kind_of(regime) == "group_size":
        kwargs.update(num_generations=value, steps_per_generation=4 * accumulation)  # 16 / N prompts
    elif kind_of(regime) == "long":
        kwargs.update(max_completion_length=settings["long_completion_length"],
                      learning_rate=settings["long_learning_rate"])  # fmt: skip
    kwargs["learning_rate"] *= spec.get("learning_rate_scale", 1)
    overrides = dict(config_of(regime, config_name).overrides)
    if "num_generations" in overrides:
        prompts = kwargs["per_device_train_batch_size"] // kwargs["num_generations"]
        overrides["per_device_train_batch_size"] = prompts * overrides["num_generations"]
    return kwargs | overrides


def regime_task(regime: str) -> tuple[str, dict[str, Any]]:
    """The policy a regime trains and its task's `make_arithmetic_dataset` kwargs (the long-chain variant for long)."""
    task = TASKS["long" if kind_of(regime) == "long" else "default"]
    return task.policy, dict(task.task)


def run_one(regime: str, value: int, config_name: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Train one configuration with one seed; its accuracies (before, after, every `eval_every` steps) and curves."""
    common.setup_environment()
    started, cpu_started = time.perf_counter(), time.process_time()
    device = common.resolve_device(settings["device"])
    import transformers
    from transformers import PrinterCallback, TrainerCallback

    from trl_groupopt.data import offline, rewards

    transformers.logging.set_verbosity_error()
    config, (policy, task), every = config_of(regime, config_name), regime_task(regime), settings.get("eval_every")
    method = None if config.method == TRL else config.method
    make_config, trainer_class = common.trainer_classes(method)
    train_set = offline.make_arithmetic_dataset(settings["num_train"], seed=0, split="train", **task)
    eval_set = offline.make_arithmetic_dataset(settings["num_eval"], seed=0, split="test", **task)
    accuracy: dict[str, list] = {"steps": [], "values": []}
    with tempfile.TemporaryDirectory(prefix=f"stress-{config_name}-{seed}-") as workdir:
        args = make_config(**run_settings(regime, value, config_name, seed, settings, workdir))
        trainer = trainer_class(model=policy, reward_funcs=[rewards.accuracy_reward, rewards.format_reward],
                                args=args, train_dataset=train_set)  # fmt: skip
        trainer.remove_callback(PrinterCallback)

        def evaluate(step: int) -> None:  # greedy decoding draws no random numbers: the samples are unchanged
            accuracy["steps"].append(step)
            accuracy["values"].append(offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_set,
                                      max_new_tokens=args.max_completion_length)["accuracy"])  # fmt: skip

        class Recorder(TrainerCallback):
            def on_step_end(self, _args, state, control, **kwargs):
                if every and state.global_step % every == 0 and state.global_step < _args.max_steps:
                    evaluate(state.global_step)

            def on_log(self, _args, state, control, **kwargs):  # before TRL's log clears `_metrics`
                record_extremes(trainer, state.log_history[-1])

        trainer.add_callback(Recorder())
        evaluate(0)
        train_started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - train_started
        evaluate(trainer.state.global_step)
        history = [e for e in trainer.state.log_history if "train_runtime" not in e]

    def series(key: str) -> dict[str, list]:
        points = [(e["step"], e[key]) for e in history if e.get(key) is not None]
        return {"steps": [int(s) for s, _ in points], "values": [float(v) for _, v in points]}

    keys = sorted({k for e in history for k in e if k.startswith(MECHANISM_PREFIXES)})
    return {"regime": regime, "value": value, "config": config_name, "method": config.method, "seed": seed,
            "device_info": common.describe_device(device), "initial_accuracy": accuracy["values"][0],
            "final_accuracy": accuracy["values"][-1], **({"accuracy": accuracy} if every else {}),
            "num_generations": args.num_generations, "per_device_train_batch_size": args.per_device_train_batch_size,
            "reward": series("reward"), "entropy": series("entropy"), "completion_length": series(
                "completions/mean_length"), "mechanism": {key: series(key) for key in keys}, "train_s": train_s,
            "wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu_started}  # fmt: skip


def record_extremes(trainer: Any, entry: dict[str, Any]) -> None:
    """Add to a training log entry each probed metric's min and max over the optimizer step's micro-batches: TRL's
    `log` averages what `_metrics` collected since the last entry, with `logging_steps=1` the step's micro-batches."""
    for key in (probe["metric"] for probe in PROBES.values()) if trainer.model.training else ():
        values = [v for v in trainer._metrics["train"].get(key, []) if v == v]  # NaN: nothing measured
        if values:
            entry.update({f"{key}_min": min(values), f"{key}_max": max(values)})


GRID = Grid(("regime", "value", "config", "seed"), run_one,
            lambda r: f"accuracy {r['initial_accuracy']:.1%} -> {r['final_accuracy']:.1%} ({r['wall_s']:.0f} s)")  # fmt: skip


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
    compared = stats.compare_pair(mine, theirs, better=claim["better"], accuracy=claim["outcome"].endswith("accuracy"),
                                  acted=acted)  # fmt: skip
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


# ------------------------------------------------------------------------------------------------ the grids
def cells_of(args: argparse.Namespace) -> dict[tuple, int]:
    """The cells the flags select: (regime, value, configuration) -> seeds. The claims grid: each claim's
    configuration and baseline with its stage-1 seeds, and every probe cell (not with `--claim-ids`)."""
    cells: dict[tuple, int] = {}

    def add(regime: str, value: int, config: str, seeds: int) -> None:  # a cell two claims share: the larger plan
        cells[(regime, value, config)] = max(cells.get((regime, value, config), 0), seeds)

    for regime in args.regime_list if args.grid != "claims" else ():
        values, configs = args.smoke_cells.get(regime) or (REGIMES[regime]["values"], REGIMES[regime]["configs"])
        for value, config in ((v, c) for v in values for c in configs):
            add(regime, value, config, args.seeds)
    chosen = [c for c in args.claim_list or CLAIM_SEEDS if not args.smoke or c in SMOKE_CLAIMS]
    for claim in (c for c in CLAIMS if args.grid == "claims" and c["id"] in chosen):
        for config in (c for c in (claim["config"], claim["baseline"]) if c):
            add(claim["regime"], claim["value"], config, 1 if args.smoke else CLAIM_SEEDS[claim["id"]][0])
    if args.grid == "claims" and args.claim_list is None:  # the probe
        smoke = [(*SMOKE_PROBE, c, 1) for c in REGIMES[SMOKE_PROBE[0]]["configs"]]
        for cell in smoke if args.smoke else probe_cells():
            add(*cell)
    return {key: n for key, n in cells.items() if selected(args, key)}


def selected(args: argparse.Namespace, key: tuple) -> bool:
    """Whether `--regimes` and `--configs` select this (regime, value, configuration) cell."""
    return key[0] in args.regime_list and (not args.configs or key[2] in args.configs.split(","))


def jobs_of(cells: dict[tuple, int]) -> list[tuple]:
    """Every (regime, value, configuration, seed), most expensive first (long completions, large groups, most updates
    per rollout, N = 16: the pool ends together), and seed by seed within a cost class (a stopped grid leaves
    configurations and baselines paired)."""

    def cost(job: tuple) -> tuple:
        size = config_of(job[0], job[2]).overrides.get("num_generations", 0)
        return kind_of(job[0]) != "long", kind_of(job[0]) != "group_size", -size, -job[1], job[3]

    return sorted(((*key, seed) for key, n in cells.items() for seed in range(n)), key=cost)


def collect(args: argparse.Namespace, jobs: list[tuple], settings: dict[str, Any], path: Path, command: str) -> Runs:
    """The runs to summarise: `--from-runs` as it is; else `path` after running the jobs whose keys it lacks (all of
    them with `--fresh`). Runs made with other settings are refused, never mixed."""
    if not args.from_runs and args.fresh and path.exists():
        path.unlink()
    runs = read_runs(args.from_runs or path, GRID)
    if not args.from_runs and any("settings" not in r for r in runs.records):
        raise SystemExit(f"{path} holds runs written without their settings (before runs files were keyed): pass "
                         "--fresh to run the grid again, or --output-dir for a new runs file (--from-runs rebuilds "
                         "the summary from this one).")  # fmt: skip
    conflict = settings_conflict(GRID, runs, settings)
    if conflict:
        raise SystemExit(f"{conflict}. Pass the flags it was made with, or --output-dir for a new runs file, or "
                         "--fresh to discard its runs.")  # fmt: skip
    if not args.from_runs:
        todo = pending(GRID, runs, jobs)
        print(f"{len(todo)} of {len(jobs)} run(s) to do, {args.workers} worker(s)", flush=True)
        run_grid(GRID, todo, settings, path, command, workers=args.workers)
        runs = read_runs(path, GRID)
    return runs


def provenance(runs: Runs, command: str, workers: int) -> dict[str, Any]:
    """What made the runs: the invocations' commands, workers and total wall time; a runs file written before
    invocation records takes them from the summary JSON written beside it, else from this command."""
    beside = runs.path.with_name(runs.path.name.replace("_runs.jsonl", ".json"))
    if runs.invocations:
        return {"command": " ; ".join(dict.fromkeys(i["command"] for i in runs.invocations)),
                "workers": max(i["workers"] for i in runs.invocations),
                "wall_s": sum(i["wall_s"] for i in runs.invocations), "invocations": runs.invocations}  # fmt: skip
    if beside.exists() and beside != runs.path:
        old = json.loads(beside.read_text())
        return {"command": old["command"], "workers": old["settings"]["workers"], "wall_s": old["wall_s"]}
    return {"command": command, "workers": workers, "wall_s": sum(r.get("wall_s") or 0.0 for r in runs.records)}


def build_payload(args: argparse.Namespace, runs: Runs, cells: dict[tuple, int], settings: dict[str, Any],
                  command: str) -> dict[str, Any]:  # fmt: skip
    """stress.json, claims.json or sample_efficiency.json: the settings, the summary (and the claims and probe
    tables), the failed runs and where the runs came from."""
    made, records = provenance(runs, command, args.workers), runs.records
    device = next((r["device_info"] for r in records if "device_info" in r), None)
    payload: dict[str, Any] = {
        "benchmark": args.grid, "device": device or common.describe_device(settings["device"]),
        "command": made["command"], "smoke": args.smoke,
        "settings": {"seeds": args.seeds, **settings, "workers": made["workers"], "regimes": sorted({r for r, _, _ in
                     cells}), "configs": {c: config_of(r, c)._asdict() for r, _, c in cells}},
        "ci_definition": "mean ± t_{0.975, n-1} * s / sqrt(n) over seeds (Student t, sample std)",
        "summary": summarise(records),
    }  # fmt: skip
    if args.grid == "sample_efficiency":
        example = run_settings("sample_efficiency", 4, "grpo", 0, settings, "<tmp>")
        payload["settings"]["shared_config"] = {k: v for k, v in example.items() if k not in ("output_dir", "seed")}
        payload["jitter2_definition"] = " ".join(common.jitter2.__doc__.split())
    if args.grid == "claims":
        payload["settings"].update(seeds=None, claim_seeds=CLAIM_SEEDS, pilot_seeds=PILOT_SEEDS,
                                   probe_seeds=PROBE_SEEDS)  # fmt: skip
        payload.update(verdict_rule=VERDICT_RULE, stage_rule=STAGE_RULE, claims=claims_table(records),
                       probe=probe_table(records))  # fmt: skip
    payload.update(failed_runs=[{**dict(zip(GRID.key_fields, GRID.key(r))), "error": r["error"][-2000:]}
                                for r in records if "error" in r], runs_total=len(records),
                   run_wall_s=common.mean_ci([r.get("wall_s") for r in records]), wall_s=made["wall_s"])  # fmt: skip
    return payload | ({"invocations": made["invocations"]} if "invocations" in made else {})


def plot(payload: dict[str, Any], path: Path) -> Path | None:
    """Per regime of the stress grid, final held-out accuracy against the knob per configuration (mean, 95% CI);
    sample efficiency: each configuration's held-out accuracy over training (mean, 95% band)."""
    plt, summary = common.pyplot(), payload["summary"]
    regimes = [r for r in [*GRID_REGIMES, "sample_efficiency"] if r in summary]
    if plt is None or not regimes:
        return None
    fig, axes = plt.subplots(1, len(regimes), figsize=(5.5 * len(regimes) + 2, 4.8), squeeze=False)
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate({**CONFIGS, **SE_CONFIGS})}
    for ax, regime in zip(axes[0], regimes):
        values = sorted(summary[regime], key=float)
        if regime == "sample_efficiency":
            for name, e in summary[regime][values[0]].items():
                curve = common.mean_curve(e["accuracy_curves"])
                ax.plot(curve["steps"], curve["mean"], color=colors[name], label=f"{name} (n={len(e['seeds'])})")
                ax.fill_between(curve["steps"], curve["low"], curve["high"], color=colors[name], alpha=0.15)
            ax.set(title="held-out greedy accuracy (mean, 95% CI over seeds)", xlabel="optimizer step")
        for i, name in enumerate(c for c in CONFIGS if regime != "sample_efficiency" and any(
                c in summary[regime][v] for v in values)):  # fmt: skip
            points = [(j + i * 0.04, summary[regime][v][name]["final_accuracy"]) for j, v in enumerate(values)
                      if name in summary[regime][v]]  # fmt: skip
            ax.errorbar([x for x, _ in points], [p["mean"] for _, p in points], [p["ci95"] or 0 for _, p in points],
                        marker="o", capsize=2, label=name, color=colors[name])  # fmt: skip
            ax.set(title=f"{regime}: final held-out accuracy (mean, 95% CI)", xticks=range(len(values)),
                   xticklabels=values, xlabel=textwrap.fill(REGIMES[regime]["knob"], 70))  # fmt: skip
        ax.legend(fontsize=6, ncol=2)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{payload['benchmark']}, embedded tiny policies ({payload['device']['description']})", fontsize=10)
    return common.save_figure(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add, mode = parser.add_argument, parser.add_mutually_exclusive_group()
    mode.add_argument("--claims", dest="grid", action="store_const", const="claims", default="stress",
                      help="The claims grid: each claim's cells with its planned seeds (stage 2 included) and "
                      "ECHO's probe, at 64 steps and 200 held-out prompts.")  # fmt: skip
    mode.add_argument("--sample-efficiency", dest="grid", action="store_const", const="sample_efficiency",
                      help="Every method in one mild regime: accuracy curves, 100 steps, 3 seeds.")  # fmt: skip
    add("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    add("--smoke", action="store_true", help="A few cells, 1 seed, 2 steps, a small task: seconds.")
    add("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="cpu: one core per run is the fastest.")
    add("--regimes", help="Comma-separated subset of " + ", ".join(REGIMES) + " (default: the grid's).")
    add("--configs", help="Comma-separated subset of configurations (default: each regime's).")
    add("--claim-ids", help="With --claims: only these claims' cells (with their seeds), no probe cell.")
    add("--seeds", type=int, help="Seeds per configuration: 0..seeds-1 (`GRIDS`; claims: `CLAIM_SEEDS`).")
    add("--max-steps", type=int, help="Optimizer steps per run, the same for all (default: `GRIDS`).")
    add("--long-learning-rate", type=float, help="The long regime's learning rate (1e-5: the long-chain policy "
        "degrades at the demo's 1e-4).")  # fmt: skip
    add("--workers", type=int, default=1, help="Parallel runs (processes, one torch thread each).")
    add("--fresh", action="store_true", help="Discard the runs file's records and run the whole grid again.")
    add("--from-runs", type=Path, help="Skip training: summarise, tabulate and plot this runs JSONL file.")
    args = parser.parse_args(argv)
    grid = GRIDS[args.grid]
    args.claim_list = args.claim_ids.split(",") if args.claim_ids else None
    if args.claim_list and (args.grid != "claims" or not set(args.claim_list) <= set(CLAIM_SEEDS)):
        parser.error(f"--claim-ids takes --claims and ids of {list(CLAIM_SEEDS)} (got {args.claim_ids!r})")
    args.regime_list = args.regimes.split(",") if args.regimes else grid["regimes"]
    if not set(args.regime_list) <= set(REGIMES):
        parser.error(f"unknown regime(s) in {args.regimes!r}; choose from {list(REGIMES)}")
    args.seeds = 1 if args.smoke else args.seeds or grid["seeds"]
    args.smoke_cells = grid.get("smoke", {}) if args.smoke else {}
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    common.setup_environment()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the spawned workers: one thread each, as in this process
    settings = {"device": common.resolve_device(args.device), **GRIDS[args.grid]["settings"]}
    flags = dict(max_steps=args.max_steps, long_learning_rate=args.long_learning_rate) | (SMOKE if args.smoke else {})
    settings.update({k: v for k, v in flags.items() if k in settings and v is not None})
    stem = args.grid + ("_smoke" if args.smoke else "")
    runs_path, command = args.output_dir / f"{stem}_runs.jsonl", common.command_line("benchmarks.stress", argv)
    cells = cells_of(args)
    runs = collect(args, jobs_of(cells), settings, runs_path, command)
    if args.grid == "claims" and not args.from_runs and not args.smoke:  # stage 2, in the same invocation
        rows = [row for row in claims_table(runs.records) if args.claim_list is None or row["id"] in args.claim_list]
        more = {k: n for k, n in stage2_cells(rows).items() if selected(args, k) and n > cells.get(k, 0)}
        if more:
            cells.update(more)
            args.fresh = False  # stage 1's runs stay
            runs = collect(args, jobs_of(cells), settings, runs_path, command)
    payload = build_payload(args, runs, cells, settings, command)
    written = [common.write_json(args.output_dir / f"{stem}.json", payload), plot(payload,
               args.output_dir / f"{stem}.png"), None if args.from_runs else runs_path]  # fmt: skip
    if payload["failed_runs"]:
        print(f"{len(payload['failed_runs'])} run(s) failed: see failed_runs in the JSON")
    print(f"wrote {', '.join(str(p) for p in written if p)}; {len(runs.records)} run(s), "
          f"{payload['wall_s'] / 60:.1f} min of wall time in all", flush=True)  # fmt: skip
    return payload


if __name__ == "__main__":
    main()
