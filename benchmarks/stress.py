"""Stress benchmark: each paper's claim tested in the regime where it should show, on the embedded task.

The full grid (`REGIMES`: staleness, group size, long completions; 16 optimizer steps, 5 seeds) trains every
configuration (`CONFIGS`: each registered method at its defaults and the `VARIANTS`) from the demo's settings
(`trl_groupopt.cli.DEMO_DEFAULTS`) with the regime's knob (`run_settings`), records held-out greedy accuracy before and
after and every mechanism metric logged per optimizer step (`run_one`), and summarises each cell over seeds. The
claims grid (`--claims`) runs each claim of `claims.jsonl` in its regime with its planned seeds, and ECHO's batch-clip
probe, and judges each claim by the rule of `trl-groupopt compare` (`claims_table`). Runs go through the library's
runner (`trl_groupopt.runs`): keyed, appendable runs files, resumed by the same command. What each regime tests and
why, the settings and the costs: benchmarks/README.md and docs/results.md.

    python -m benchmarks.stress --smoke --output-dir outputs/bench                     # seconds
    python -m benchmarks.stress --workers 2 --fresh                                    # the full grid (~20 min)
    python -m benchmarks.stress --claims --from-runs benchmarks/results/claims_runs.jsonl  # rebuild, no training
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_groupopt import METHODS, stats

from . import common, runner

GSPO = dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, loss_type="grpo")  # GSPO v2 5.1


@dataclass(frozen=True)
class Config:
    """A registry method with config overrides (applied after the regime's settings)."""

    method: str
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""


#: The variants the regimes run besides each registered method at its defaults (`CONFIGS` holds one per entry of
#: `trl_groupopt.METHODS`, so a new method has a configuration without an entry here). The paper's single epsilon (0.2) left ECHO's R
#: unclipped at staleness 16 (R within [0.954, 1.008]): `echo_step_tight`'s clip shows the mechanism acting; not a
#: paper setting, no claim is tested on it. `ctpo_otb`: CTPO's objective on OTB's per-token baseline.
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
CONFIGS: dict[str, Config] = {name: Config(name, {}, spec.display_name) for name, spec in METHODS.items()} | VARIANTS

# regime -> the knob it varies, its values, and the configurations run at every value.
REGIMES: dict[str, dict[str, Any]] = {
    "staleness": {
        "knob": "optimizer steps per generation (2 micro-batches of 8 per step)",
        "values": [1, 4, 16],
        "micro_batches": 2,  # per optimizer step, so ECHO's "step" and "micro_batch" scopes differ
        "configs": [
            "grpo",
            "gspo",
            "echo",
            "echo_step",
            "echo_step_tight",
            "ctpo",
            "ctpo_geomean",
            "dfpo",
            "dfpo_orth_proj",
            "dfpo_orth_proj_unclipped",
            "grpo_fix",
        ],
    },  # fmt: skip
    "group_size": {
        "knob": "completions per prompt N (16 sequences per micro-batch)",
        "values": [2, 4, 8, 16],
        "configs": ["grpo", "otb", "gspo", "dfpo"],
    },
    "long": {
        "knob": "8-12 operations on operands 1-20, completions of 71-143 tokens, long-chain policy, 4 optimizer "
        "steps per generation",
        "values": [4],
        "configs": ["grpo", "gspo", "otb", "ctpo", "echo", "dfpo", "ctpo_otb"],
    },
}


def _echo_probe(micro_batches: int, learning_rate_scale: int, configs: list[str]) -> dict[str, Any]:
    """A regime of ECHO's batch-clip probe: staleness 16 and 32 at `learning_rate_scale` x the demo's learning rate,
    each optimizer step's 16 sequences in `micro_batches` micro-batches."""
    return {
        "kind": "staleness",
        "knob": f"optimizer steps per generation ({micro_batches} micro-batches of {16 // micro_batches} per step, "
        f"learning rate x{learning_rate_scale})",
        "values": [16, 32],
        "micro_batches": micro_batches,
        "learning_rate_scale": learning_rate_scale,
        "configs": configs,
        "probe": "echo",
    }


# ECHO's batch clip at the paper's epsilon (0.2) where R could plausibly leave [0.8, 1.2]: twice the claim's
# staleness (32 updates per rollout), 3x and 10x the learning rate, and 8 micro-batches of 2 per step (a micro-batch
# scope R over 2 sequences instead of 8: noisier). The "step" scope forms R over the whole step's tokens, which the
# split does not change, so the 8-micro-batch regimes run the "micro_batch" scope only. Run by the claims grid
# (`--claims`), not by the full grid; `PROBES` says which claims read them.
# GRPO runs beside them at each learning rate: where the clip acts, ECHO's claims are tested against it there.
REGIMES.update(
    echo_probe_lr1=_echo_probe(2, 1, ["echo", "echo_step", "grpo"]),
    echo_probe_lr3=_echo_probe(2, 3, ["echo", "echo_step", "grpo"]),
    echo_probe_lr10=_echo_probe(2, 10, ["echo", "echo_step", "grpo"]),
    echo_probe_mb8_lr1=_echo_probe(8, 1, ["echo"]),
    echo_probe_mb8_lr10=_echo_probe(8, 10, ["echo"]),
)
#: The regimes the full grid runs by default (the probe regimes run with `--claims`).
GRID_REGIMES = [name for name, spec in REGIMES.items() if "probe" not in spec]
#: Seeds 0..PILOT_SEEDS-1 of every claim cell are the pilot (an internal pilot: they stay in the claims' samples)
#: whose paired standard deviations size each claim's seeds (`benchmarks/power.py`).
PILOT_SEEDS = 8
#: A probed mechanism: the per-step metric whose range the probe reports (its extremes over a step's micro-batches
#: where recorded, `EXTREMES`), and `cells`, (regime, value) -> seeds where its configurations also run: ECHO's
#: claims were first tested at staleness 16 (the paper's 8-16 updates per rollout), where the clip never acted in the
#: pilot's 8 seeds; the claims moved to where it acts (`acting_setting`), and these runs stay in the probe.
PROBES: dict[str, dict[str, Any]] = {
    "echo": {"metric": "echo/batch_ratio", "what": "R", "cells": {("staleness", 16): PILOT_SEEDS}},
}
PROBE_SEEDS = 3  # seeds per probe cell: the probe measures R's range, not accuracy
SMOKE_REGIMES = {"staleness": [1], "group_size": [2], "long": [1]}
SMOKE_CONFIGS = {"staleness": ["grpo", "echo"], "group_size": ["otb"], "long": ["ctpo"]}

#: Logged keys kept per optimizer step (every key starting with one of these), besides reward and entropy.
MECHANISM_PREFIXES = ("echo/", "dfpo/", "ctpo/", "otb/", "clip_ratio/")
#: Scalar per-micro-batch metrics whose min and max over each optimizer step's micro-batches a run also records
#: (`<key>_min`, `<key>_max`): the log entry holds their mean, which hides a clipped micro-batch's R.
EXTREMES = ("echo/batch_ratio",)
#: Diagnostics summarised beside each method's mechanism keys (`MECHANISM_METRICS`); a method without an entry has
#: its mechanism's keys alone.
EXTRA_METRICS: dict[str, tuple[str, ...]] = {
    "echo": ("clip_ratio/region_mean",),
    "ctpo": ("ctpo/dual_clip",),
    "dfpo": ("dfpo/cancellation_residual", "dfpo/asym_after", "dfpo/asym_before"),
}
#: The metrics that show each method's mechanism acting (summarised and plotted per configuration): its
#: `Mechanism`'s logged keys (the same ones `MECHANISM_ACTS` reads), then `EXTRA_METRICS`.
MECHANISM_METRICS: dict[str, tuple[str, ...]] = {
    name: tuple(dict.fromkeys((*spec.mechanism.keys, *EXTRA_METRICS.get(name, ())))) for name, spec in METHODS.items()
}


def __getattr__(name: str):
    """`MECHANISM_ACTS`: when a logged optimizer step shows the method's mechanism changing the objective (what acted,
    the logged keys, a predicate on their values), the library's one definition per method
    (`trl_groupopt.methods.MECHANISM_ACTS`, also read by the trainers' report), imported on first use so that `--help`
    imports no trl_groupopt. The claims table reports on how many of a claim's optimizer steps it acted; a claim whose
    mechanism never acted is not tested by its regime."""
    if name == "MECHANISM_ACTS":
        from trl_groupopt.methods import MECHANISM_ACTS

        return MECHANISM_ACTS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Each paper's claim and where it is tested, one row of data per claim (`benchmarks/claims.jsonl`): id, paper, claim,
#: regime, value, config, baseline (None: a within-run mechanism claim), outcome (a per-run number, `outcome_of`),
#: better (+1 when larger is the claimed direction), probe (ECHO's: see `PROBES`) and seeds, its stage-1 and stage-2
#: seeds (`STAGE_RULE`). ECHO's claims sit where its batch clip acts (`acting_setting`; a test checks it).
CLAIMS: tuple[dict[str, Any], ...] = tuple(
    {key: value for key, value in json.loads(line).items() if key != "seeds"}
    for line in (Path(__file__).with_name("claims.jsonl")).read_text().splitlines()
    if line.strip()
)
#: The claims grid's budget (`--claims`): the demo's policy gains 11-16 points in 80 steps, and 200 held-out prompts
#: put a single accuracy's binomial standard error near 3 points (64 prompts: 5.6).
CLAIMS_BUDGET = dict(max_steps=64, num_eval=200)
#: Per claim, its seeds at stage 1 and (None: no second stage) at stage 2 (`STAGE_RULE`): the plan of the power
#: analysis (`python -m benchmarks.power`, from the full grid's runs and the pilot; a test checks they agree), fixed
#: before any seed beyond the pilot ran.
CLAIM_SEEDS: dict[str, tuple[int, int | None]] = {
    row["id"]: tuple(row["seeds"])
    for row in map(json.loads, Path(__file__).with_name("claims.jsonl").read_text().splitlines())
}
FLOOR = stats.FLOOR  # accuracy outcomes where config and baseline both end at or below this: inconclusive
EQUIVALENCE_MARGIN = stats.EQUIVALENCE_MARGIN  # accuracy: differences inside +-2 points are "no difference"
#: A claim's verdict from the engine's (`trl-groupopt compare`, `trl_groupopt.stats.compare_pair`) on the claim's
#: outcome, with the claimed direction as "better".
CLAIM_VERDICTS = {stats.BETTER: "reproduced", stats.WORSE: "not reproduced", stats.NO_DIFFERENCE: "not reproduced",
                  stats.INCONCLUSIVE: "inconclusive", stats.NOT_RUN: "not run"}  # fmt: skip
VERDICT_RULE = (
    "the rule of `trl-groupopt compare` (trl_groupopt.stats), with d = config - baseline paired by seed (for a "
    "mechanism claim without baseline, the within-run log ratio) and the claimed direction as better: reproduced: "
    "the 95% interval of mean d excludes 0 on the claimed side; not reproduced: it excludes 0 on the other side, or "
    f"(accuracy outcomes) lies inside +-{EQUIVALENCE_MARGIN:.0%}; inconclusive otherwise, and whenever both config "
    f"and baseline end at <= {FLOOR:.0%} accuracy (floor effect) or the method's mechanism acted on none of the "
    "claim's optimizer steps (the regime does not test it)"
)
INERT = "mechanism inert at the paper's epsilon in every regime tried"
INERT_RULE = (
    "a claim that names a probe (ECHO's: the `echo_probe_*` regimes) and whose mechanism acted on none of its own "
    f'optimizer steps is decided as "{INERT}" when it also acted on none of the optimizer steps of every probe '
    "cell (each probe regime x value x configuration, all run); the note gives the probed metric's range. If it acted "
    "in some probe cell, the claim stays inconclusive: its regime does not test it"
)
RUNNING = "running"  # a claim whose planned seeds have not all run yet: no verdict
STAGE_RULE = (
    "each claim is decided on its first `seeds` seeds (stage 1, `CLAIM_SEEDS`, sized by the power analysis); a claim "
    "inconclusive at stage 1 for lack of precision (not the floor, not an idle mechanism) whose plan has a stage 2 "
    "runs seeds up to its stage-2 count and is decided on those; no third stage. A row with fewer seeds than "
    f'planned has no verdict yet: "{RUNNING}", with how many of its planned seeds have run and the interval so far'
)


# ------------------------------------------------------------------------------------------------ one run
def run_settings(regime: str, value: int, config_name: str, seed: int, settings: dict[str, Any],
                 output_dir: str) -> dict[str, Any]:  # fmt: skip
    """The config kwargs of one run: demo defaults, the shared budget, the regime's knob, then the configuration's.
    A regime's `kind` (default: its name) says what its value sets; `micro_batches` splits each optimizer step's
    sequences, `learning_rate_scale` multiplies the learning rate."""
    spec = REGIMES[regime]
    kwargs = runner.demo_config(settings, seed, output_dir)
    split = spec.get("micro_batches", 1)  # the same sequences per step, in `split` micro-batches
    accumulation = settings["grad_accum"] * split
    kwargs.update(
        per_device_train_batch_size=kwargs["per_device_train_batch_size"] // split,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=4 * accumulation,
    )
    kind = spec.get("kind", regime)
    if kind == "staleness":
        kwargs["steps_per_generation"] = value * accumulation
    elif kind == "group_size":
        kwargs["num_generations"] = value  # 16 sequences per micro-batch whatever N: 16 / N prompts
    elif kind == "long":
        kwargs["steps_per_generation"] = value * accumulation
        kwargs["max_completion_length"] = settings["long_completion_length"]
        kwargs["learning_rate"] = settings["long_learning_rate"]
    kwargs["learning_rate"] *= spec.get("learning_rate_scale", 1)
    kwargs.update(CONFIGS[config_name].overrides)
    return kwargs


def regime_task(regime: str) -> tuple[str, dict[str, Any]]:
    """The policy a regime trains and the task variant's `make_arithmetic_dataset` kwargs: the long regime trains the
    long-chain policy on the long-chain variant, the others the embedded policy on the default task."""
    from trl_groupopt.offline import VARIANTS

    variant = VARIANTS["long" if REGIMES[regime].get("kind", regime) == "long" else "default"]
    return variant.policy, dict(variant.task)


def availability(config_name: str, settings: dict[str, Any], regime: str | None = None) -> str | None:
    """None if this checkout's config accepts the configuration (in `regime`, by default the first that runs it),
    else the reason (the knob arrives with a merge)."""
    from trl_groupopt import get_method

    config = CONFIGS[config_name]
    regime = regime or next(r for r, spec in REGIMES.items() if config_name in spec["configs"])
    try:
        get_method(config.method).make_config(
            **run_settings(regime, REGIMES[regime]["values"][0], config_name, 0, settings, tempfile.gettempdir())
        )
    except (TypeError, ValueError) as error:  # unknown field / rejected value
        return f"skipped, not available in this checkout: {type(error).__name__}: {error}".splitlines()[0][:300]
    return None


def run_one(regime: str, value: int, config_name: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Train one configuration with one seed; return its accuracies and logged curves (JSON-ready)."""
    common.setup_environment()
    started, cpu_started = time.perf_counter(), time.process_time()
    device = common.resolve_device(settings["device"])
    import transformers
    from transformers import PrinterCallback

    from trl_groupopt import get_method, offline, rewards

    transformers.logging.set_verbosity_error()
    spec = get_method(CONFIGS[config_name].method)
    policy, task = regime_task(regime)
    train_set = offline.make_arithmetic_dataset(settings["num_train"], seed=0, split="train", **task)
    eval_set = offline.make_arithmetic_dataset(settings["num_eval"], seed=0, split="test", **task)
    max_new = settings["long_completion_length"] if REGIMES[regime].get("kind", regime) == "long" else None
    with tempfile.TemporaryDirectory(prefix=f"stress-{config_name}-{seed}-") as workdir:
        config = spec.make_config(**run_settings(regime, value, config_name, seed, settings, workdir))
        trainer = recording_extremes(spec.trainer_class)(
            model=policy,
            reward_funcs=[rewards.accuracy_reward, rewards.format_reward],
            args=config,
            train_dataset=train_set,
        )
        trainer.remove_callback(PrinterCallback)
        max_new = max_new or config.max_completion_length

        def evaluate() -> float:
            # Greedy decoding consumes no random numbers, so evaluating does not change the training samples.
            return offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_set,
                                           max_new_tokens=max_new)["accuracy"]  # fmt: skip

        initial = evaluate()
        train_started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - train_started
        final = evaluate()
        history = [e for e in trainer.state.log_history if "train_runtime" not in e]

    def series(key: str) -> dict[str, list]:
        points = [(e["step"], e[key]) for e in history if e.get(key) is not None]
        return {"steps": [int(s) for s, _ in points], "values": [float(v) for _, v in points]}

    keys = sorted({k for e in history for k in e if k.startswith(MECHANISM_PREFIXES)})
    return {
        "regime": regime,
        "value": value,
        "config": config_name,
        "method": CONFIGS[config_name].method,
        "seed": seed,
        "device_info": common.describe_device(device),
        "initial_accuracy": initial,
        "final_accuracy": final,
        "reward": series("reward"),
        "completion_length": series("completions/mean_length"),
        "mechanism": {key: series(key) for key in keys},
        "train_s": train_s,
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,  # ~ the wall time on an idle core (one torch thread)
    }


def recording_extremes(trainer_class: type) -> type:
    """`trainer_class` whose training log entries also hold, for each `EXTREMES` key, its min and max over the
    optimizer step's micro-batches (TRL's `log` averages the values `_metrics` collected since the last entry; with
    `logging_steps=1` those are the step's micro-batches). Training is unchanged."""

    class RecordingExtremes(trainer_class):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self.model.training:
                for key in EXTREMES:
                    values = [v for v in self._metrics["train"].get(key, []) if v == v]  # NaN: nothing measured
                    if values:
                        logs[f"{key}_min"], logs[f"{key}_max"] = min(values), max(values)
            super().log(logs, start_time)

    RecordingExtremes.__name__ = RecordingExtremes.__qualname__ = trainer_class.__name__
    return RecordingExtremes


def describe(run: dict[str, Any]) -> str:
    """A finished run in the progress log."""
    return (f"accuracy {run['initial_accuracy']:.1%} -> {run['final_accuracy']:.1%} ({run['train_s']:.0f} s "
            f"training, {run['wall_s']:.0f} s in all)")  # fmt: skip


GRID = runner.Grid(("regime", "value", "config", "seed"), run_one, describe)


# ------------------------------------------------------------------------------------------------ the grid
def _cost_order(job: tuple) -> tuple:
    """Most expensive first (long completions, then large groups, which decode longer per prompt, then the most
    updates per rollout, which generate the largest batches) so that the pool ends together."""
    kind = REGIMES[job[0]].get("kind", job[0])
    return kind != "long", kind != "group_size", -job[1]


def jobs_of(regimes: dict[str, list[int]], configs: dict[str, list[str]], seeds: int) -> list[tuple]:
    jobs = [(r, v, c, s) for r, values in regimes.items() for v in values for c in configs[r] for s in range(seeds)]
    return sorted(jobs, key=_cost_order)


# ------------------------------------------------------------------------------------------------ summaries
def outcome_of(run: dict[str, Any], outcome: str) -> float | None:
    """A run's scalar outcome: "final_accuracy", "accuracy_gain", "mean_reward", "mechanism:<key>" (mean over
    training), or "log_ratio:<a>:<b>" (mean over the logged steps of log(a / b): < 0 when a is smaller)."""
    import math

    if outcome == "final_accuracy":
        return run["final_accuracy"]
    if outcome == "accuracy_gain":
        return run["final_accuracy"] - run["initial_accuracy"]
    if outcome == "mean_reward":
        return common.mean(run["reward"]["values"])
    if outcome.startswith("mechanism:"):
        return common.mean(run["mechanism"].get(outcome.split(":", 1)[1], {}).get("values", []))
    if outcome.startswith("log_ratio:"):
        _, top, bottom = outcome.split(":")
        ours = run["mechanism"].get(top, {})
        theirs = dict(zip(*(run["mechanism"].get(bottom, {}).get(k, []) for k in ("steps", "values"))))
        logs = [math.log(a / theirs[step]) for step, a in zip(ours.get("steps", []), ours.get("values", []))
                if theirs.get(step) and a > 0 and theirs[step] > 0]  # fmt: skip
        return common.mean(logs)
    raise ValueError(f"unknown outcome {outcome!r}")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """regime -> str(value) -> config -> mean/CI of the outcomes and of the mechanism metrics' means."""
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {}
    for run in ok:
        out.setdefault(run["regime"], {}).setdefault(str(run["value"]), {}).setdefault(run["config"], []).append(run)
    summary: dict[str, Any] = {}
    for regime, by_value in out.items():
        for value, by_config in by_value.items():
            for config_name, rs in by_config.items():
                rs.sort(key=lambda r: r["seed"])
                entry: dict[str, Any] = {"label": CONFIGS[config_name].label if config_name in CONFIGS else config_name,
                                         "seeds": [r["seed"] for r in rs]}  # fmt: skip
                for outcome in ("final_accuracy", "accuracy_gain", "mean_reward"):
                    per_seed = [outcome_of(r, outcome) for r in rs]
                    entry[outcome] = {**common.mean_ci(per_seed), "per_seed": per_seed}
                method = rs[0].get("method", "")
                mech = {}
                for key in MECHANISM_METRICS.get(method, ()):
                    per_seed = [outcome_of(r, f"mechanism:{key}") for r in rs]
                    curve = common.mean_curve([r["mechanism"].get(key) for r in rs])
                    mech[key] = {**common.mean_ci(per_seed), "per_seed": per_seed,
                                 "mean_curve": {"steps": curve["steps"], "mean": curve["mean"]}}  # fmt: skip
                entry["mechanism"] = mech
                entry["train_s"] = common.mean_ci([r["train_s"] for r in rs])
                summary.setdefault(regime, {}).setdefault(value, {})[config_name] = entry
    return summary


def mechanism_acted(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """On how many logged optimizer steps of `runs` (one configuration) its method's mechanism acted
    (`MECHANISM_ACTS`); None for a method without an entry."""
    from trl_groupopt.methods import MECHANISM_ACTS

    if not runs or runs[0].get("method") not in MECHANISM_ACTS:
        return None
    what, keys, acts = MECHANISM_ACTS[runs[0]["method"]]
    steps = acted = 0
    for run in runs:
        series = [dict(zip(*(run["mechanism"].get(key, {}).get(k, []) for k in ("steps", "values")))) for key in keys]
        for step in series[0]:
            values = [s.get(step) for s in series]
            if all(v is not None and v == v for v in values):  # NaN: nothing to measure on that step
                steps += 1
                acted += bool(acts(*values))
    return {"what": what, "steps": steps, "acted": acted, "fraction": acted / steps if steps else None}


def probe_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per probed cell (each probe regime x value x configuration, and the claims' own cells of a probed method):
    seeds, logged optimizer steps, on how many the mechanism acted, and the probed metric's range over every step of
    every seed (each step's extremes over its micro-batches where recorded, `EXTREMES`)."""
    ok = [r for r in runs if "error" not in r]
    claimed = [(c["regime"], c["value"], c["config"]) for c in CLAIMS if c.get("probe")]
    probed = [
        (regime, value, config) for regime, value, config, _ in probe_cells() if CONFIGS[config].method in PROBES
    ]
    order = {name: i for i, name in enumerate(REGIMES)}
    rows = []
    for regime, value, config in sorted(set(claimed + probed), key=lambda c: (order[c[0]], c[1], c[2])):
        rs = sorted((r for r in ok if (r["regime"], r["value"], r["config"]) == (regime, value, config)),
                    key=lambda r: r["seed"])  # fmt: skip
        metric = PROBES[CONFIGS[config].method]["metric"]
        low = [v for r in rs for v in _extreme_series(r, metric, "min")]
        high = [v for r in rs for v in _extreme_series(r, metric, "max")]
        acted = mechanism_acted(rs) or {"steps": 0, "acted": 0}
        spec = REGIMES[regime]
        rows.append({"regime": regime, "value": value, "config": config, "seeds": len(rs),
                     "micro_batches": spec.get("micro_batches", 1),
                     "learning_rate_scale": spec.get("learning_rate_scale", 1), "metric": metric,
                     "steps": acted["steps"], "acted": acted["acted"],
                     "low": min(low) if low else None, "high": max(high) if high else None})  # fmt: skip
    return rows


ACTING_FRACTION = 0.1  # `acting_setting`: the batch clip acted on at least this share of the optimizer steps


def acting_setting(runs: list[dict[str, Any]]) -> tuple[str, int] | None:
    """Where ECHO's claims are tested when the probe found the batch clip acting (declared before the probe ran):
    the mildest probe setting (regime, value), by learning-rate scale, then updates per rollout, among those that run
    both scopes, where the clip acted on >= `ACTING_FRACTION` of the optimizer steps of each scope and the mean final
    accuracies of both scopes and of GRPO are above `FLOOR`; None if there is no such setting."""
    ok = [r for r in runs if "error" not in r]
    acting = {(row["regime"], row["value"], row["config"]) for row in probe_table(ok)
              if row["steps"] and row["acted"] >= ACTING_FRACTION * row["steps"]}  # fmt: skip
    candidates = sorted(((spec["learning_rate_scale"], value, regime) for regime, spec in REGIMES.items()
                         if spec.get("probe") == "echo" and {"echo", "echo_step"} <= set(spec["configs"])
                         for value in spec["values"]))  # fmt: skip
    for _, value, regime in candidates:
        levels = [common.mean([r["final_accuracy"] for r in ok if (r["regime"], r["value"], r["config"]) == cell])
                  for cell in ((regime, value, c) for c in ("echo", "echo_step", "grpo"))]  # fmt: skip
        scopes_act = all((regime, value, c) in acting for c in ("echo", "echo_step"))
        if scopes_act and all(level is not None and level > FLOOR for level in levels):
            return regime, value
    return None


def probe_cells() -> list[tuple[str, int, str, int]]:
    """Every (regime, value, configuration, seeds) the probes run: each probe regime's values and configurations with
    `PROBE_SEEDS` seeds, and each probe's extra `cells` with its probed configurations."""
    cells = [(regime, value, config, PROBE_SEEDS) for regime, spec in REGIMES.items() if "probe" in spec
             for value in spec["values"] for config in spec["configs"]]  # fmt: skip
    for method, probe in PROBES.items():
        probed = [c for c in CONFIGS if CONFIGS[c].method == method and any(
            c in REGIMES[r]["configs"] for r, spec in REGIMES.items() if spec.get("probe") == method)]  # fmt: skip
        cells += [(regime, value, config, n) for (regime, value), n in probe.get("cells", {}).items()
                  for config in probed]  # fmt: skip
    return cells


def _extreme_series(run: dict[str, Any], metric: str, which: str) -> list[float]:
    """A run's per-step `metric` extremes (`<metric>_min` / `_max`; the step mean where they were not recorded)."""
    series = run["mechanism"].get(f"{metric}_{which}") or run["mechanism"].get(metric) or {"values": []}
    return [v for v in series["values"] if v == v]


def inert_finding(claim: dict[str, Any], probes: list[dict[str, Any]]) -> str | None:
    """`INERT_RULE`'s note for `claim` when its probe found the mechanism idle in every cell (all run), else None."""
    method = CONFIGS[claim["config"]].method
    cells = [row for row in probes if CONFIGS[row["config"]].method == method]
    if not cells or any(not row["steps"] or row["acted"] for row in cells):
        return None
    what = PROBES[method]["what"]
    low, high = min(row["low"] for row in cells), max(row["high"] for row in cells)
    regimes = len({(row["regime"], row["value"]) for row in cells})
    return (
        f"{what} within [{low:.3f}, {high:.3f}] on all {sum(row['steps'] for row in cells)} optimizer steps of "
        f"{len(cells)} probed cells ({regimes} regime settings, both scopes where they differ): never clipped"
    )


def _claim_row(claim: dict[str, Any], ok: list[dict[str, Any]], seeds: int | None) -> dict[str, Any]:
    """`claim` evaluated on the paired seeds below `seeds` (None: every seed): the difference, its verdict by
    `VERDICT_RULE`, and on how many optimizer steps the mechanism acted."""

    def pick(config_name):
        return {r["seed"]: r for r in ok if r["regime"] == claim["regime"] and r["value"] == claim["value"]
                and r["config"] == config_name and (seeds is None or r["seed"] < seeds)}  # fmt: skip

    ours = pick(claim["config"])
    base = pick(claim["baseline"]) if claim["baseline"] else None
    accuracy = claim["outcome"].endswith("accuracy")
    acted = mechanism_acted(list(ours.values()))
    outcome = {s: outcome_of(r, claim["outcome"]) for s, r in ours.items()}
    compared = stats.compare_pair(outcome, None if base is None else {s: outcome_of(r, claim["outcome"])
                                  for s, r in base.items()}, better=claim["better"], accuracy=accuracy, acted=acted)  # fmt: skip
    row = {**claim, "n": compared["n"], "difference": compared["difference"], "config_outcome": common.mean_ci(
        list(outcome.values())), "baseline_outcome": common.mean_ci([outcome_of(r, claim["outcome"])
        for r in base.values()]) if base is not None else None}  # fmt: skip
    row["verdict"] = CLAIM_VERDICTS[compared["verdict"]]
    row["mechanism_acted"] = acted
    row["max_steps"] = max((r["settings"]["max_steps"] for r in ours.values() if "settings" in r), default=None)
    if compared["note"]:
        row["note"] = compared["note"].replace("the setting does not test the method", "the regime does not test "
                                               "the claim")  # fmt: skip
    return row


def claims_table(runs: list[dict[str, Any]], staged: bool = True) -> list[dict[str, Any]]:
    """Evaluate `CLAIMS` on the runs (paired by seed), with the verdict of `VERDICT_RULE`; `staged`: on the seeds
    `CLAIM_SEEDS` plans, by `STAGE_RULE`, with `INERT_RULE` (else on every seed of the runs)."""
    ok = [r for r in runs if "error" not in r]
    probes = probe_table(ok)
    rows = []
    for claim in CLAIMS:
        stage1, stage2 = CLAIM_SEEDS[claim["id"]] if staged else (None, None)
        row = _claim_row(claim, ok, stage1)
        if staged:
            row.update(stage=1, planned_seeds=stage1)
        if stage2 and row["verdict"] == "inconclusive" and "note" not in row and row["n"] >= stage1:
            first = {key: row[key] for key in ("n", "difference", "verdict")}
            row = {**_claim_row(claim, ok, stage2), "stage": 2, "planned_seeds": stage2, "stage1": first}
        finding = inert_finding(claim, probes) if staged and claim.get("probe") else None
        if finding and row.get("note", "").endswith("the regime does not test the claim"):
            row["verdict"], row["note"] = INERT, finding
        if staged and 0 < row["n"] < row["planned_seeds"]:  # not decided before its planned seeds (`STAGE_RULE`)
            row["verdict"] = RUNNING
            row["note"] = f"{row['n']} of {row['planned_seeds']} planned seeds" + (
                " (stage 2)" if row["stage"] == 2 else ""
            )
        rows.append(row)
    return rows


def stage2_cells(rows: list[dict[str, Any]]) -> dict[tuple, int]:
    """The cells (regime, value, configuration) -> seeds that `STAGE_RULE` adds after stage 1."""
    cells: dict[tuple, int] = {}
    for row in rows:
        if row.get("stage") == 2:
            for config in (row["config"], row["baseline"]):
                if config:
                    key = (row["regime"], row["value"], config)
                    cells[key] = max(cells.get(key, 0), row["planned_seeds"])
    return cells


def verdict(differences: dict[str, Any], better: int, outcome: str) -> str:
    """`VERDICT_RULE`'s interval part on the mean/CI of the paired differences (`trl_groupopt.stats.verdict`)."""
    margin = EQUIVALENCE_MARGIN if outcome.endswith("accuracy") else None
    return CLAIM_VERDICTS[stats.verdict(differences, better, margin)]


def _probe_markdown(probe: list[dict[str, Any]]) -> list[str]:
    """The lines of ECHO's probe table (R's range per regime and configuration), for `claims_markdown`."""

    def ratio(x):
        return "n/a" if x is None else f"{x:.3f}"

    lines = [
        "",
        "ECHO's batch clip at the paper's epsilon (batch bounds [0.8, 1.2]), in the claims' regime and in the "
        "probe regimes (`echo_probe_*`): R's range over every optimizer step of every seed (each step's extremes "
        "over its micro-batches).",
        "",
        "| regime | updates per rollout | micro-batches per step | learning rate | configuration | seeds | "
        "optimizer steps | R clipped (steps) | R min | R max |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in probe:
        lines.append(f"| {row['regime']} | {row['value']} | {row['micro_batches']} | "
                     f"x{row['learning_rate_scale']} | `{row['config']}` | {row['seeds']} | {row['steps']} | "
                     f"{row['acted']} | {ratio(row['low'])} | {ratio(row['high'])} |")  # fmt: skip
    return lines


def claims_markdown(payload: dict[str, Any]) -> str:
    """The results page's claims table and ECHO's probe table, from claims.json alone (no hand-typed numbers)."""

    def fmt(stats, outcome):
        if not stats or stats.get("mean") is None:
            return "n/a"
        pct = outcome.endswith("accuracy")
        f = (lambda x: f"{100 * x:+.1f} pt") if pct else (lambda x: f"{x:+.3g}")
        if stats.get("low") is None:
            return f(stats["mean"]) + " (1 seed)"
        return f"{f(stats['mean'])} [{f(stats['low'])}, {f(stats['high'])}]"

    def level(stats, outcome):
        if not stats or stats.get("mean") is None:
            return "n/a"
        return f"{stats['mean']:.1%}" if outcome.endswith("accuracy") else f"{stats['mean']:.3g}"

    regimes = {name: spec["knob"] for name, spec in REGIMES.items()}

    def acted(row):
        a = row.get("mechanism_acted")
        return "n/a" if not a or not a["steps"] else f"{a['what']}: {a['acted']}/{a['steps']} steps"

    def seeds(row):
        text = f"{row['n']}"
        if row.get("planned_seeds") and row["n"] < row["planned_seeds"]:
            text += f" of {row['planned_seeds']} planned"
        if row.get("stage") == 2:
            first = row["stage1"]
            text += f" (stage 2; stage 1: {first['n']} seeds, {fmt(first['difference'], row['outcome'])})"
        return text

    lines = [
        "| paper | claim | regime tested here | measured: config vs baseline | difference, mean [95% CI] | seeds | "
        "steps | mechanism acted (optimizer steps, all seeds) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in payload["claims"]:
        regime = f"{row['regime']} = {row['value']} ({regimes.get(row['regime'], '')})"
        what = row["outcome"].replace("mechanism:", "")
        if what.startswith("log_ratio:"):
            what = "log({} / {})".format(*what.split(":")[1:])
        if row["baseline"]:
            measured = (f"{what}: `{row['config']}` {level(row['config_outcome'], row['outcome'])} vs "
                        f"`{row['baseline']}` {level(row['baseline_outcome'], row['outcome'])}")  # fmt: skip
        else:
            measured = f"`{row['config']}`: {what}, mean over training (< 0: lower)"
        note = f" ({row['note']})" if row.get("note") else ""
        if row["verdict"] == "not run" and row["config"] in payload.get("skipped", {}):
            note = f" (`{row['config']}`: {payload['skipped'][row['config']]})"
        lines.append(f"| {row['paper']} | {row['claim']} | {regime} | {measured} | "
                     f"{fmt(row['difference'], row['outcome'])} | {seeds(row)} | {row.get('max_steps') or 'n/a'} | "
                     f"{acted(row)} | **{row['verdict']}**{note} |")  # fmt: skip
    if payload.get("probe"):
        lines += _probe_markdown(payload["probe"])
    s = payload["settings"]
    lines += [
        "",
        f"Verdict rule: {VERDICT_RULE}. Inert mechanism: {INERT_RULE}. Seeds: {STAGE_RULE}. Budget per run: "
        f"{s['max_steps']} optimizer steps, held-out greedy accuracy on {s['num_eval']} prompts; the seeds column "
        "counts the seeds paired. Generated by `python -m benchmarks.report` from `benchmarks/results/claims.json` "
        f"(`{payload['command']}`; {payload['runs_total']} runs, {payload['wall_s'] / 3600:.1f} h of wall time with "
        f"{s['workers']} workers).",
    ]
    return "\n".join(lines) + "\n"


def plot(payload: dict[str, Any], path: Path) -> Path | None:
    """Per regime: final accuracy vs the knob per configuration (mean, 95% CI), and the mechanism metric curves."""
    plt = common.pyplot()
    if plt is None:
        return None
    summary = payload["summary"]
    regimes = [r for r in GRID_REGIMES if r in summary]  # the probe's R range is a table (claims.md)
    if not regimes:
        return None
    fig, axes = plt.subplots(2, len(regimes), figsize=(5.5 * len(regimes), 8), squeeze=False)
    cmap = plt.get_cmap("tab20")
    colors = {name: cmap(i % 20) for i, name in enumerate(CONFIGS)}
    for col, regime in enumerate(regimes):
        by_value = summary[regime]
        values = sorted(by_value, key=float)
        ax = axes[0][col]
        configs = [c for c in CONFIGS if any(c in by_value[v] for v in values)]
        for i, c in enumerate(configs):
            xs, ys, es = [], [], []
            for j, v in enumerate(values):
                if c in by_value[v]:
                    fa = by_value[v][c]["final_accuracy"]
                    xs.append(j + (i - len(configs) / 2) * 0.04)
                    ys.append(fa["mean"])
                    es.append(fa["ci95"] or 0.0)
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=2, label=c, color=colors[c], linewidth=1)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(values)
        ax.set_xlabel(textwrap.fill(REGIMES[regime]["knob"], 70), fontsize=8)
        ax.set_title(f"{regime}: final held-out accuracy (mean, 95% CI)", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        ax.grid(alpha=0.3)
        ax = axes[1][col]
        v = values[-1]
        for c, e in by_value[v].items():
            for k, m in list(e["mechanism"].items())[:1]:
                curve = m["mean_curve"]
                if curve["steps"]:
                    ax.plot(curve["steps"], curve["mean"], label=f"{c}: {k}", color=colors.get(c), linewidth=1)
        ax.set_title(f"{regime} = {v}: mechanism metric over training (seed mean)", fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Stress regimes, embedded tiny policies ({payload['device']['description']})", fontsize=10)
    return common.save_figure(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Stress regimes (staleness, group size, long completions) where each paper claims its "
        "advantage, on the embedded task (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    parser.add_argument("--smoke", action="store_true", help="One value per regime, few configs, 1 seed, 2 steps.")
    parser.add_argument("--claims", action="store_true",
                        help="The claims grid: each claim's configuration and baseline in its regime with the seeds "
                        "CLAIM_SEEDS plans (stage 2 included) and ECHO's probe regimes, at CLAIMS_BUDGET; writes "
                        "claims_runs.jsonl and claims.json. Without it: the full grid (GRID_REGIMES).")  # fmt: skip
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                        help="The 1M-parameter policy trains fastest on one CPU core per run (--workers).")  # fmt: skip
    parser.add_argument("--regimes", help="Comma-separated subset of " + ", ".join(REGIMES) + " (default: the full "
                        "grid's, " + ", ".join(GRID_REGIMES) + "; with --claims every regime a claim or probe "
                        "names).")  # fmt: skip
    parser.add_argument("--configs", help="Comma-separated subset of configurations (default: each regime's).")
    parser.add_argument("--claim-ids", help="With --claims: only these claims' cells (comma-separated ids of CLAIMS), "
                        "with these claims' seeds, and no probe cell; a stage 2 only for them.")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=5,
                        help="Seeds per configuration (0..seeds-1); --claims takes CLAIM_SEEDS.")  # fmt: skip
    parser.add_argument("--max-steps", type=int,
                        help="Optimizer steps per run (the same budget for all; default 16, with --claims "
                        f"{CLAIMS_BUDGET['max_steps']}).")  # fmt: skip
    parser.add_argument(
        "--grad-accum", type=int, default=1, help="Micro-batches (of 16 sequences) per optimizer step."
    )
    parser.add_argument("--num-train", type=int, default=1000, help="Training prompts.")
    parser.add_argument("--num-eval", type=int, help="Held-out prompts (greedy accuracy; default 64, with --claims "
                        f"{CLAIMS_BUDGET['num_eval']}).")  # fmt: skip
    parser.add_argument("--long-completion-length", type=int,
                        help="max_completion_length, long regime (default: the task's "
                        "trl_groupopt.offline.LONG_CHAIN_MAX_COMPLETION_LENGTH).")  # fmt: skip
    parser.add_argument("--long-learning-rate", type=float, default=1e-5,
                        help="Learning rate of the long regime, every configuration (the others use the demo's 1e-4): "
                        "the long-chain policy degrades at 1e-4 (see the module docstring).")  # fmt: skip
    runner.add_grid_arguments(parser)
    args = parser.parse_args(argv)
    default_regimes = REGIMES if args.claims else GRID_REGIMES
    args.claim_list = [c.strip() for c in (args.claim_ids or "").split(",") if c.strip()] or None
    unknown_claims = [c for c in args.claim_list or [] if c not in CLAIM_SEEDS]
    if unknown_claims or (args.claim_list and not args.claims):
        parser.error(f"--claim-ids takes --claims and ids of {list(CLAIM_SEEDS)} (got {args.claim_ids!r})")
    args.regime_list = [r.strip() for r in (args.regimes or ",".join(default_regimes)).split(",") if r.strip()]
    unknown = [r for r in args.regime_list if r not in REGIMES]
    if unknown:
        parser.error(f"unknown regime(s) {unknown}; choose from {list(REGIMES)}")
    budget = CLAIMS_BUDGET if args.claims else dict(max_steps=16, num_eval=64)
    args.max_steps = args.max_steps or budget["max_steps"]
    args.num_eval = args.num_eval or budget["num_eval"]
    if args.smoke:
        args.seeds, args.max_steps, args.num_train, args.num_eval = 1, 2, 128, 8
        args.long_completion_length = 48
    if args.long_completion_length is None:  # imported after parsing: `--help` imports no trl
        from trl_groupopt.offline import LONG_CHAIN_MAX_COMPLETION_LENGTH

        args.long_completion_length = LONG_CHAIN_MAX_COMPLETION_LENGTH
    return args


def _wanted(args: argparse.Namespace, regime: str, config_name: str) -> bool:
    """Whether `--regimes` and `--configs` select this cell."""
    configs = {c.strip() for c in args.configs.split(",")} if args.configs else None
    return regime in args.regime_list and (configs is None or config_name in configs)


def _check_available(cells: list[tuple[str, str]], settings: dict[str, Any]) -> dict[str, str]:
    """The configurations of these (regime, configuration) cells that this checkout cannot build, with the reason."""
    skipped: dict[str, str] = {}
    for regime, name in cells:
        why = None if name in skipped else availability(name, settings, regime)
        if why:
            skipped[name] = why
            print(f"  {name}: {why}", flush=True)
    return skipped


def plan(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[dict, dict, dict[str, str]]:
    """The full grid the flags ask for: regime -> values, regime -> configurations (those this checkout can build),
    and the configurations skipped with the reason."""
    regimes = {r: (SMOKE_REGIMES[r] if args.smoke else REGIMES[r]["values"]) for r in args.regime_list}
    configs = {r: [c for c in (SMOKE_CONFIGS[r] if args.smoke else REGIMES[r]["configs"]) if _wanted(args, r, c)]
               for r in regimes}  # fmt: skip
    skipped = _check_available(sorted({(r, c) for r, cs in configs.items() for c in cs}, key=lambda rc: rc[1]),
                               settings)  # fmt: skip
    return regimes, {r: [c for c in cs if c not in skipped] for r, cs in configs.items()}, skipped


SMOKE_CLAIMS = ("echo_off_policy", "ctpo_long")  # --claims --smoke: these claims' cells and one probe cell, 1 seed
SMOKE_PROBE = {"echo_probe_lr10": [16]}


def claims_plan(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[dict[tuple, int], dict[str, str]]:
    """The claims grid's stage 1 as the flags select it: (regime, value, configuration) -> seeds (each claim's
    configuration and baseline with its `CLAIM_SEEDS`, each probe cell with `PROBE_SEEDS`), and the configurations
    skipped with the reason."""
    cells: dict[tuple, int] = {}
    for claim in CLAIMS:
        if args.smoke and claim["id"] not in SMOKE_CLAIMS or not _claim_wanted(args, claim["id"]):
            continue
        for config in (claim["config"], claim["baseline"]):
            if config:
                key = (claim["regime"], claim["value"], config)
                cells[key] = max(cells.get(key, 0), 1 if args.smoke else CLAIM_SEEDS[claim["id"]][0])
    probes = ([(r, v, c, 1) for r, values in SMOKE_PROBE.items() for v in values for c in REGIMES[r]["configs"]]
              if args.smoke else probe_cells()) if args.claim_list is None else []  # fmt: skip
    for regime, value, config, n in probes:
        cells[(regime, value, config)] = max(cells.get((regime, value, config), 0), n)
    cells = {key: n for key, n in cells.items() if _wanted(args, key[0], key[2])}
    skipped = _check_available(list(dict.fromkeys((r, c) for r, _, c in cells)), settings)
    return {key: n for key, n in cells.items() if key[2] not in skipped}, skipped


def _claim_wanted(args: argparse.Namespace, claim_id: str) -> bool:
    """Whether `--claim-ids` selects this claim (all claims without it)."""
    return getattr(args, "claim_list", None) is None or claim_id in args.claim_list


def cell_jobs(cells: dict[tuple, int]) -> list[tuple]:
    """Every (regime, value, configuration, seed) of the cells, most expensive first (see `jobs_of`), and within a
    cost class seed by seed, so that an interrupted grid leaves its configurations and baselines paired."""
    jobs = ((*key, seed) for key, n in cells.items() for seed in range(n))
    return sorted(jobs, key=lambda job: (*_cost_order(job), job[3]))


def payload_settings(args: argparse.Namespace, regimes: dict, configs: dict, workers: int) -> dict[str, Any]:
    """The summary's "settings": the budget, the grid and what every run shares."""
    return {
        "seeds": args.seeds,
        "max_steps": args.max_steps,
        "gradient_accumulation_steps": args.grad_accum,
        "num_train": args.num_train,
        "num_eval": args.num_eval,
        "long_completion_length": args.long_completion_length,
        "long_learning_rate": args.long_learning_rate,
        "workers": workers,
        "regimes": {
            r: {
                "knob": REGIMES[r]["knob"],
                "values": v,
                "configs": configs[r],
                "micro_batches_per_step": REGIMES[r].get("micro_batches", 1),
                **({"learning_rate_scale": REGIMES[r]["learning_rate_scale"]} if "probe" in REGIMES[r] else {}),
            }
            for r, v in regimes.items()
        },
        "configs": {name: {"method": c.method, "overrides": c.overrides} for name, c in CONFIGS.items()},
        "policy": "trl_groupopt.offline.EMBEDDED_POLICY_PATH; the long regime: EMBEDDED_LONG_POLICY_PATH",
        "long_task": "trl_groupopt.offline.LONG_CHAIN",
        "rewards": ["accuracy_reward", "format_reward"],
        "shared_config": "trl_groupopt.cli.DEMO_DEFAULTS with the regime's knob (see run_settings)",
    }


def build_payload(args: argparse.Namespace, runs: runner.Runs, grid_plan: tuple, device: str,
                  command: str) -> dict[str, Any]:  # fmt: skip
    """stress.json (claims.json with `--claims`): the settings, the summary per regime x value x configuration
    (with `--claims`: the claims table, ECHO's probe table and the rules), provenance."""
    regimes, configs, skipped = grid_plan
    made = runner.provenance(runs, command, args.workers)
    records = runs.records
    payload: dict[str, Any] = {
        "benchmark": "claims" if args.claims else "stress",
        "device": runner.recorded_device(runs, device),
        "command": made["command"],
        "smoke": args.smoke,
        "settings": payload_settings(args, regimes, configs, made["workers"]),
        "ci_definition": "mean ± t_{0.975, n-1} * s / sqrt(n) over seeds (Student t, sample std)",
        "skipped": skipped,
        "summary": summarise(records),
    }
    if args.claims:
        payload["settings"].update(seeds=None, claim_seeds=CLAIM_SEEDS, pilot_seeds=PILOT_SEEDS,
                                   probe_seeds=PROBE_SEEDS)  # fmt: skip
        payload.update(verdict_rule=VERDICT_RULE, inert_rule=INERT_RULE, stage_rule=STAGE_RULE,
                       claims=claims_table(records), probe=probe_table(records))  # fmt: skip
    payload.update(
        failed_runs=runner.failed_runs(GRID, runs),
        runs_total=len(records),
        run_wall_s=common.mean_ci([r["wall_s"] for r in records if "wall_s" in r]),
        run_cpu_s=common.mean_ci([r["cpu_s"] for r in records if "cpu_s" in r]),
    )
    return runner.close_payload(payload, made)


def collect_claims(args: argparse.Namespace, settings: dict[str, Any], runs_path: Path, command: str,
                   device: str) -> tuple[runner.Runs, tuple]:  # fmt: skip
    """The claims grid: stage 1 and the probe, then the stage-2 seeds `STAGE_RULE` adds (not in a smoke run)."""
    cells, skipped = claims_plan(args, settings)
    if not args.from_runs:
        print(f"{sum(cells.values())} runs in {len(cells)} cells (claims and probe; {args.max_steps} steps each) on "
              f"{device}, {args.workers} worker(s)", flush=True)  # fmt: skip
    runs = runner.collect(GRID, args, cell_jobs(cells), settings, runs_path, command)
    if not args.from_runs and not args.smoke:
        rows = [row for row in claims_table(runs.records) if _claim_wanted(args, row["id"])]
        more = {key: n for key, n in stage2_cells(rows).items()
                if _wanted(args, key[0], key[2]) and key[2] not in skipped and n > cells.get(key, 0)}  # fmt: skip
        if more:
            print(f"stage 2: {', '.join(f'{r}={v} {c}: {n} seeds' for (r, v, c), n in more.items())}", flush=True)
            cells.update(more)
            resumed = argparse.Namespace(**{**vars(args), "fresh": False})  # stage 1's runs stay
            runs = runner.collect(GRID, resumed, cell_jobs(cells), settings, runs_path, command)
    regimes: dict[str, list] = {}
    configs: dict[str, list] = {}
    for regime, value, config in cells:
        regimes.setdefault(regime, []).append(value)
        configs.setdefault(regime, []).append(config)
    regimes = {r: sorted(set(v)) for r, v in regimes.items()}
    configs = {r: list(dict.fromkeys(c)) for r, c in configs.items()}
    return runs, (regimes, configs, skipped)


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    device = runner.start(args)
    settings = dict(device=device, max_steps=args.max_steps, num_train=args.num_train, num_eval=args.num_eval,
                    long_completion_length=args.long_completion_length, grad_accum=args.grad_accum,
                    long_learning_rate=args.long_learning_rate)  # fmt: skip
    stem = ("claims" if args.claims else "stress") + ("_smoke" if args.smoke else "")
    runs_path = args.output_dir / f"{stem}_runs.jsonl"
    command = common.command_line("benchmarks.stress", argv)
    if args.claims:
        runs, grid_plan = collect_claims(args, settings, runs_path, command, device)
    else:
        grid_plan = plan(args, settings)
        regimes, configs, _ = grid_plan
        jobs = jobs_of(regimes, configs, args.seeds)
        if not args.from_runs:
            print(f"{len(jobs)} runs ({', '.join(f'{r}: {v}' for r, v in regimes.items())}; {args.seeds} seed(s); "
                  f"{args.max_steps} steps each) on {device}, {args.workers} worker(s)", flush=True)  # fmt: skip
        runs = runner.collect(GRID, args, jobs, settings, runs_path, command)
    payload = build_payload(args, runs, grid_plan, device, command)
    if args.claims:
        print(claims_markdown(payload))
    json_path = common.write_json(args.output_dir / f"{stem}.json", payload)
    png = plot(payload, args.output_dir / f"{stem}.png")
    runner.print_end(payload, runs, [json_path, None if args.from_runs else runs_path, png])
    return payload


if __name__ == "__main__":
    main()
