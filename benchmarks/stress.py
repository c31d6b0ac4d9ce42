"""Stress benchmark: each paper's claim tested in the regime where it should show, on the embedded task.

Every run trains the embedded tiny policy (`trl_groupopt.offline.EMBEDDED_POLICY_PATH`) on the synthetic arithmetic
task with the demo's settings (`trl_groupopt.cli.DEMO_DEFAULTS`: lr 1e-4 constant, 16 sequences per micro-batch, no
KL; rewards accuracy + format), `--grad-accum` (1) micro-batch per optimizer step, and the same budget for every
configuration (`--max-steps`, 16, optimizer steps = the same number of generated samples, since each sample is trained
on once). This budget is small (256 samples per run): it is sized so the whole grid runs in ~20 min on 2 cores,
so accuracy differences are expected to be small and the mechanism metrics carry most of the evidence.
GRPO (the base trainer, TRL's objective) and GSPO (the base trainer with `importance_sampling_level="sequence"`,
GSPO's epsilons 3e-4 / 4e-4, `loss_type="grpo"`) are the baselines. Regimes (`REGIMES`):

- staleness: 1, 4 and 16 optimizer steps per generation (`steps_per_generation = k x gradient_accumulation_steps`):
  the later micro-batches of a generation batch are trained k - 1 optimizer steps after the policy sampled them.
  ECHO (micro_batch and step scopes), CTPO (cumprod, geomean), DFPO (min_replace, orth_proj over all / unclipped
  tokens), GRPO-fix, against GRPO and GSPO. Each optimizer step's 16 sequences come as 2 micro-batches of 8
  (`micro_batches` in `REGIMES`): with one micro-batch per step ECHO's two batch-ratio scopes would be the same
  computation.
- group size: N = 2, 4, 8, 16 completions per prompt at a fixed 16 sequences per micro-batch (so 8, 4, 2, 1 prompts):
  OTB vs GRPO, DFPO vs GSPO.
- long completions: the long-chain variant of the task (`trl_groupopt.offline.LONG_CHAIN`: 8-12 operations on operands
  1..20, correct completions of 71-143 tokens, `max_completion_length=160`) trained from the long-chain policy
  (`EMBEDDED_LONG_POLICY_PATH`, which writes the whole chain and is right some of the time), 4 optimizer steps per
  generation: GRPO, GSPO, OTB, CTPO, ECHO, DFPO. Learning rate `--long-learning-rate` (1e-5) for every configuration:
  a policy that must get ~10 steps right in a row is more fragile than the default one, and at the demo's 1e-4 GRPO
  took it from 28.1% to 1.6-7.8% held-out accuracy in 16 steps on every one of 5 seeds; at 3e-5 OTB fell on 2 of 3
  seeds (to 18.8% and 20.3%); at 1e-5 GRPO and OTB held or gained on 3 of 3 (probe:
  `--regimes long --configs grpo,otb --seeds 3 --long-learning-rate LR`). Chosen on the baselines before the grid,
  not per method.

Recorded per run (JSONL, one line per run, with its settings and wall time): held-out greedy accuracy before and after training (`--num-eval`
prompts of the regime's test split), the training reward per generation batch, and every mechanism metric the
trainer logs (`MECHANISM_PREFIXES`: ECHO's batch-ratio clip rate `echo/batch_clipped`, DFPO's
`dfpo/cancellation_residual`, CTPO's clip and dual-clip rates, OTB's gradient second moment and the group-mean
baseline's, TRL's `clip_ratio/*`) per optimizer step from `trainer.state.log_history`. A configuration whose config
knob does not exist in this checkout (or whose value its config rejects) is skipped with a note, never a crash.

`stress.json` summarises, per regime x value x configuration, mean and 95% Student-t interval over seeds of the
final accuracy, the accuracy gain, the mean training reward and each mechanism metric's mean over training, and
evaluates the claims table (`CLAIMS`, `claims_table`): paired by seed (same seed = same prompts and the same initial
samples), the difference method - baseline with its 95% interval, and a verdict by the rule in `VERDICT_RULE`.
`python -m benchmarks.report` writes `claims.md` from `stress.json`.

The runs go through the shared grid runner (`benchmarks.runner`): `--workers` processes, every finished run appended
at once to `stress_runs.jsonl`, keyed by regime, value, configuration and seed. Running the grid again with the
same `--output-dir` runs only the keys the file lacks (so a grid can be split over several invocations, e.g. by
`--regimes`, `--configs` or a larger `--seeds`), and the summary covers every run of the file; `--fresh` starts
over. `stress.json`'s `wall_s` is the total wall time of the invocations that trained the runs.

Usage (from the repo root):
    python -m benchmarks.stress --smoke --output-dir outputs/bench                # seconds
    python -m benchmarks.stress --workers 2 --fresh                            # the committed run (~20 min)
    python -m benchmarks.stress --from-runs benchmarks/results/stress_runs.jsonl   # re-summarise, no training
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import common, runner

GSPO = dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, loss_type="grpo")  # GSPO v2 5.1


@dataclass(frozen=True)
class Config:
    """A registry method with config overrides (applied after the regime's settings)."""

    method: str
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""


CONFIGS: dict[str, Config] = {
    "grpo": Config("grpo", {}, "GRPO (base trainer, TRL's objective)"),
    "gspo": Config("grpo", GSPO, "GSPO (base trainer, sequence-level IS)"),
    "echo": Config("echo", {"batch_ratio_scope": "micro_batch"}, "ECHO, micro-batch scope"),
    "echo_step": Config("echo", {"batch_ratio_scope": "step"}, "ECHO, step scope"),
    # The paper's single epsilon (0.2) left R unclipped here (R within [0.954, 1.008] at staleness 16): a tight batch
    # clip shows what the mechanism does when it acts. Not a paper setting, so no claim is tested on it.
    "echo_step_tight": Config(
        "echo", {"batch_ratio_scope": "step", "batch_epsilon": 0.01}, "ECHO, step scope, batch clip 1 +- 0.01"
    ),  # fmt: skip
    "ctpo": Config("ctpo", {}, "CTPO (cumprod)"),
    "ctpo_geomean": Config("ctpo", {"ctpo_ratio_mode": "geomean"}, "CTPO, geometric-mean prefix ratio"),
    "dfpo": Config("dfpo", {"dfpo_transform": "min_replace"}, "DFPO min_replace"),
    "dfpo_orth_proj": Config("dfpo", {"dfpo_transform": "orth_proj"}, "DFPO orth_proj (all tokens)"),
    "dfpo_orth_proj_unclipped": Config(
        "dfpo", {"dfpo_transform": "orth_proj", "dfpo_orthogonal_over": "unclipped"}, "DFPO orth_proj, unclipped"
    ),
    "grpo_fix": Config("grpo_fix", {}, "GRPO-fix (symmetric clip)"),
    "otb": Config("otb", {}, "OTB"),
}

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
        "configs": ["grpo", "gspo", "otb", "ctpo", "echo", "dfpo"],
    },
}
SMOKE_REGIMES = {"staleness": [1], "group_size": [2], "long": [1]}
SMOKE_CONFIGS = {"staleness": ["grpo", "echo"], "group_size": ["otb"], "long": ["ctpo"]}

#: Logged keys kept per optimizer step (every key starting with one of these), besides reward and entropy.
MECHANISM_PREFIXES = ("echo/", "dfpo/", "ctpo/", "otb/", "clip_ratio/")
#: The metric that shows each method's mechanism acting (summarised and plotted per configuration).
MECHANISM_METRICS: dict[str, tuple[str, ...]] = {
    "grpo": ("clip_ratio/region_mean",),
    "echo": ("echo/batch_clipped", "clip_ratio/region_mean"),
    "ctpo": ("clip_ratio/region_mean", "ctpo/dual_clip"),
    "dfpo": ("dfpo/cancellation_residual", "dfpo/shrink", "dfpo/asym_after", "dfpo/asym_before"),
    "grpo_fix": ("dfpo/sym_clip_ratio",),
    "otb": ("otb/grad_second_moment", "otb/grad_second_moment_group_mean_baseline"),
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


#: Each paper's claim and where it is tested: (claim id, paper, claim, regime, value, config, baseline, outcome,
#: better). `outcome` is a per-run number (see `outcome_of`); `better` is +1 when larger is the claimed direction.
CLAIMS: tuple[dict[str, Any], ...] = (
    dict(id="echo_off_policy", paper="ECHO", claim="batch-level clipping trains better than token-level clipping "
         "far off-policy (8-16 updates per rollout)", regime="staleness", value=16, config="echo", baseline="grpo",
         outcome="final_accuracy", better=+1),
    dict(id="echo_step_off_policy", paper="ECHO", claim="the same with the batch ratio over the whole optimizer "
         "step", regime="staleness", value=16, config="echo_step", baseline="grpo", outcome="final_accuracy",
         better=+1),
    dict(id="ctpo_off_policy", paper="CTPO (arXiv:2605.07331)", claim="the cumulative prefix ratio with sqrt(t) "
         "clipping trains better than token-level IS far off-policy", regime="staleness", value=16, config="ctpo",
         baseline="grpo", outcome="final_accuracy", better=+1),
    dict(id="ctpo_long", paper="CTPO (arXiv:2605.07331)", claim="the cumulative ratio helps most on long "
         "completions", regime="long", value=4, config="ctpo", baseline="grpo", outcome="final_accuracy", better=+1),
    dict(id="dfpo_off_policy", paper="DFPO (arXiv:2604.13088)", claim="cancellation-free transforms beat GSPO "
         "off-policy", regime="staleness", value=16, config="dfpo", baseline="gspo", outcome="final_accuracy",
         better=+1),
    dict(id="dfpo_large_group", paper="DFPO (arXiv:2604.13088)", claim="gains over GSPO grow with the group size "
         "(its Table 4): ahead at N = 16", regime="group_size", value=16, config="dfpo", baseline="gspo",
         outcome="final_accuracy", better=+1),
    dict(id="dfpo_asymmetry", paper="DFPO (arXiv:2604.13088)", claim="the transform shrinks the within-group "
         "asymmetry of the ratio-weighted advantages that drives cancellation (mechanism, same run)",
         regime="staleness", value=16, config="dfpo", baseline=None,
         outcome="log_ratio:dfpo/asym_after:dfpo/asym_before", better=-1),
    dict(id="grpo_fix_off_policy", paper="GRPO-fix (arXiv:2604.13088)", claim="the symmetric clip trains better "
         "than GRPO's asymmetric one off-policy", regime="staleness", value=16, config="grpo_fix", baseline="grpo",
         outcome="final_accuracy", better=+1),
    dict(id="otb_small_group", paper="OTB", claim="the optimal token baseline beats the group-mean baseline with "
         "small groups", regime="group_size", value=2, config="otb", baseline="grpo", outcome="final_accuracy",
         better=+1),
    dict(id="otb_long", paper="OTB", claim="the per-token baseline helps on long completions", regime="long",
         value=4, config="otb", baseline="grpo", outcome="final_accuracy", better=+1),
    dict(id="otb_variance", paper="OTB", claim="its baseline lowers the gradient second moment below the "
         "group-mean baseline's (mechanism, same run)", regime="group_size", value=2, config="otb", baseline=None,
         outcome="log_ratio:otb/grad_second_moment:otb/grad_second_moment_group_mean_baseline", better=-1),
)  # fmt: skip
FLOOR = 0.02  # accuracy outcomes where config and baseline both end at or below this: inconclusive (floor effect)
EQUIVALENCE_MARGIN = 0.02  # accuracy: differences inside +-2 points are "no effect of practical size"
VERDICT_RULE = (
    "paired by seed, d = config - baseline (for a mechanism claim without baseline, the within-run log ratio); "
    "reproduced: the 95% interval of mean d excludes 0 on the claimed side; not reproduced: it excludes 0 on the "
    f"other side, or (accuracy outcomes) lies inside +-{EQUIVALENCE_MARGIN:.0%}; inconclusive otherwise, and "
    f"whenever both config and baseline end at <= {FLOOR:.0%} accuracy (floor effect) or the method's mechanism "
    "acted on none of the claim's optimizer steps (the regime does not test it)"
)


# ------------------------------------------------------------------------------------------------ one run
def run_settings(regime: str, value: int, config_name: str, seed: int, settings: dict[str, Any],
                 output_dir: str) -> dict[str, Any]:  # fmt: skip
    """The config kwargs of one run: demo defaults, the shared budget, the regime's knob, then the configuration's."""
    kwargs = runner.demo_config(settings, seed, output_dir)
    split = REGIMES[regime].get("micro_batches", 1)  # the same sequences per step, in `split` micro-batches
    accumulation = settings["grad_accum"] * split
    kwargs.update(
        per_device_train_batch_size=kwargs["per_device_train_batch_size"] // split,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=4 * accumulation,
    )
    if regime == "staleness":
        kwargs["steps_per_generation"] = value * accumulation
    elif regime == "group_size":
        kwargs["num_generations"] = value  # 16 sequences per micro-batch whatever N: 16 / N prompts
    elif regime == "long":
        kwargs["steps_per_generation"] = value * accumulation
        kwargs["max_completion_length"] = settings["long_completion_length"]
        kwargs["learning_rate"] = settings["long_learning_rate"]
    kwargs.update(CONFIGS[config_name].overrides)
    return kwargs


def regime_task(regime: str) -> tuple[str, dict[str, Any]]:
    """The policy a regime trains and the task variant's `make_arithmetic_dataset` kwargs: the long regime trains the
    long-chain policy on the long-chain variant, the others the embedded policy on the default task."""
    from trl_groupopt.offline import VARIANTS

    variant = VARIANTS["long" if regime == "long" else "default"]
    return variant.policy, dict(variant.task)


def availability(config_name: str, settings: dict[str, Any]) -> str | None:
    """None if this checkout's config accepts the configuration, else the reason (the knob arrives with a merge)."""
    from trl_groupopt import get_method

    config = CONFIGS[config_name]
    regime = next(r for r, spec in REGIMES.items() if config_name in spec["configs"])
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
    max_new = settings["long_completion_length"] if regime == "long" else None
    with tempfile.TemporaryDirectory(prefix=f"stress-{config_name}-{seed}-") as workdir:
        config = spec.make_config(**run_settings(regime, value, config_name, seed, settings, workdir))
        trainer = spec.trainer_class(
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


def describe(run: dict[str, Any]) -> str:
    """A finished run in the progress log."""
    return (f"accuracy {run['initial_accuracy']:.1%} -> {run['final_accuracy']:.1%} ({run['train_s']:.0f} s "
            f"training, {run['wall_s']:.0f} s in all)")  # fmt: skip


GRID = runner.Grid(("regime", "value", "config", "seed"), run_one, describe)


# ------------------------------------------------------------------------------------------------ the grid
def jobs_of(regimes: dict[str, list[int]], configs: dict[str, list[str]], seeds: int) -> list[tuple]:
    jobs = [(r, v, c, s) for r, values in regimes.items() for v in values for c in configs[r] for s in range(seeds)]
    # most expensive first (long completions, then large groups, which decode longer per prompt) so the pool ends
    # together
    jobs.sort(key=lambda j: (j[0] != "long", j[0] != "group_size", -j[1] if j[0] == "group_size" else 0))
    return jobs


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


def claims_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate `CLAIMS` on the runs (paired by seed), with the verdict of `VERDICT_RULE`."""
    ok = [r for r in runs if "error" not in r]
    rows = []
    for claim in CLAIMS:

        def pick(config_name, claim=claim):
            return {r["seed"]: r for r in ok if r["regime"] == claim["regime"] and r["value"] == claim["value"]
                    and r["config"] == config_name}  # fmt: skip

        ours = pick(claim["config"])
        base = pick(claim["baseline"]) if claim["baseline"] else None
        if base is None:
            diffs = [outcome_of(r, claim["outcome"]) for r in ours.values()]
        else:
            diffs = common.paired_differences({s: outcome_of(r, claim["outcome"]) for s, r in ours.items()},
                                              {s: outcome_of(r, claim["outcome"]) for s, r in base.items()})  # fmt: skip
        stats = common.mean_ci(diffs)
        row = {**claim, "n": stats["n"], "difference": stats,
               "config_outcome": common.mean_ci([outcome_of(r, claim["outcome"]) for r in ours.values()]),
               "baseline_outcome": common.mean_ci([outcome_of(r, claim["outcome"]) for r in base.values()])
               if base is not None else None}  # fmt: skip
        row["verdict"] = verdict(stats, claim["better"], claim["outcome"])
        row["mechanism_acted"] = mechanism_acted(list(ours.values()))
        levels = [row["config_outcome"]["mean"], (row["baseline_outcome"] or {}).get("mean")]
        if claim["outcome"].endswith("accuracy") and all(v is not None and v <= FLOOR for v in levels):
            row["verdict"] = "inconclusive"  # both at the floor: the regime cannot show a difference
            row["note"] = f"both at <= {FLOOR:.0%} accuracy: floor effect"
        elif (row["mechanism_acted"] or {}).get("steps") and not row["mechanism_acted"]["acted"]:
            row["verdict"] = "inconclusive"  # the method ran as its baseline's objective: nothing of the claim acted
            row["note"] = f"{row['mechanism_acted']['what']} on no optimizer step: the regime does not test the claim"
        rows.append(row)
    return rows


def verdict(stats: dict[str, Any], better: int, outcome: str) -> str:
    """`VERDICT_RULE` applied to the mean/CI of the paired differences."""
    if stats["n"] < 2 or stats["low"] is None:
        return "inconclusive" if stats["n"] else "not run"
    low, high = stats["low"] * better, stats["high"] * better
    low, high = min(low, high), max(low, high)
    if low > 0:
        return "reproduced"
    if high < 0:
        return "not reproduced"
    if outcome.endswith("accuracy") and -EQUIVALENCE_MARGIN < stats["low"] and stats["high"] < EQUIVALENCE_MARGIN:
        return "not reproduced"
    return "inconclusive"


def claims_markdown(payload: dict[str, Any]) -> str:
    """The results page's claims table, from stress.json alone (no hand-typed numbers)."""

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

    lines = [
        "| paper | claim | regime tested here | measured: config vs baseline | difference, mean [95% CI] | seeds | "
        "mechanism acted (optimizer steps, all seeds) | verdict |",
        "|---|---|---|---|---|---|---|---|",
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
        lines.append(f"| {row['paper']} | {row['claim']} | {regime} | {measured} | "
                     f"{fmt(row['difference'], row['outcome'])} | {row['n']} | {acted(row)} | **{row['verdict']}**{' (' + row['note'] + ')' if row.get('note') else ''} |")  # fmt: skip
    s = payload["settings"]
    lines += [
        "",
        f"Verdict rule: {VERDICT_RULE}. Budget per run: {s['max_steps']} optimizer steps "
        f"({s['seeds']} seeds, held-out accuracy on {s['num_eval']} prompts). Generated by `python -m "
        "benchmarks.report` from `benchmarks/results/stress.json`.",
    ]
    if payload.get("skipped"):
        lines.append("")
        lines.append("Skipped configurations: " + "; ".join(f"`{k}` ({v})" for k, v in payload["skipped"].items()))
    return "\n".join(lines) + "\n"


def print_summary(summary: dict[str, Any]) -> str:
    rows = []
    for regime, by_value in summary.items():
        for value, by_config in by_value.items():
            for config_name, e in by_config.items():
                fa = e["final_accuracy"]
                mech = "; ".join(
                    f"{k} {m['mean']:.3g}" for k, m in e["mechanism"].items() if m.get("mean") is not None
                )
                rows.append([regime, value, config_name, len(e["seeds"]),
                             f"{fa['mean']:.1%}" + (f" ± {fa['ci95']:.1%}" if fa.get("ci95") is not None else ""),
                             f"{e['accuracy_gain']['mean']:+.1%}", mech])  # fmt: skip
    print()
    return common.print_table(["regime", "value", "config", "seeds", "final acc (95% CI)", "gain", "mechanism"], rows)


def plot(payload: dict[str, Any], path: Path) -> Path | None:
    """Per regime: final accuracy vs the knob per configuration (mean, 95% CI), and the mechanism metric curves."""
    plt = common.pyplot()
    if plt is None:
        return None
    summary = payload["summary"]
    regimes = [r for r in REGIMES if r in summary]
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
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                        help="The 1M-parameter policy trains fastest on one CPU core per run (--workers).")  # fmt: skip
    parser.add_argument("--regimes", default=",".join(REGIMES), help="Comma-separated subset of " + ", ".join(REGIMES))
    parser.add_argument("--configs", help="Comma-separated subset of configurations (default: each regime's).")
    parser.add_argument("--seeds", type=int, default=5, help="Seeds per configuration (0..seeds-1).")
    parser.add_argument("--max-steps", type=int, default=16, help="Optimizer steps per run (the same budget for all).")
    parser.add_argument(
        "--grad-accum", type=int, default=1, help="Micro-batches (of 16 sequences) per optimizer step."
    )
    parser.add_argument("--num-train", type=int, default=1000, help="Training prompts.")
    parser.add_argument("--num-eval", type=int, default=64, help="Held-out prompts (greedy accuracy).")
    parser.add_argument("--long-completion-length", type=int,
                        help="max_completion_length, long regime (default: the task's "
                        "trl_groupopt.offline.LONG_CHAIN_MAX_COMPLETION_LENGTH).")  # fmt: skip
    parser.add_argument("--long-learning-rate", type=float, default=1e-5,
                        help="Learning rate of the long regime, every configuration (the others use the demo's 1e-4): "
                        "the long-chain policy degrades at 1e-4 (see the module docstring).")  # fmt: skip
    runner.add_grid_arguments(parser)
    args = parser.parse_args(argv)
    args.regime_list = [r.strip() for r in args.regimes.split(",") if r.strip()]
    unknown = [r for r in args.regime_list if r not in REGIMES]
    if unknown:
        parser.error(f"unknown regime(s) {unknown}; choose from {list(REGIMES)}")
    if args.smoke:
        args.seeds, args.max_steps, args.num_train, args.num_eval = 1, 2, 128, 8
        args.long_completion_length = 48
    if args.long_completion_length is None:  # imported after parsing: `--help` imports no trl
        from trl_groupopt.offline import LONG_CHAIN_MAX_COMPLETION_LENGTH

        args.long_completion_length = LONG_CHAIN_MAX_COMPLETION_LENGTH
    return args


def plan(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[dict, dict, dict[str, str]]:
    """The grid the flags ask for: regime -> values, regime -> configurations (those this checkout can build), and
    the configurations skipped with the reason."""
    regimes = {r: (SMOKE_REGIMES[r] if args.smoke else REGIMES[r]["values"]) for r in args.regime_list}
    configs = {r: list(SMOKE_CONFIGS[r] if args.smoke else REGIMES[r]["configs"]) for r in regimes}
    if args.configs:
        wanted = {c.strip() for c in args.configs.split(",")}
        configs = {r: [c for c in cs if c in wanted] for r, cs in configs.items()}
    skipped = {}
    for name in sorted({c for cs in configs.values() for c in cs}):
        why = availability(name, settings)
        if why:
            skipped[name] = why
            print(f"  {name}: {why}", flush=True)
    return regimes, {r: [c for c in cs if c not in skipped] for r, cs in configs.items()}, skipped


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
    """stress.json: the settings, the summary per regime x value x configuration, the claims table, provenance."""
    regimes, configs, skipped = grid_plan
    made = runner.provenance(runs, command, args.workers)
    records = runs.records
    payload: dict[str, Any] = {
        "benchmark": "stress",
        "device": runner.recorded_device(runs, device),
        "command": made["command"],
        "smoke": args.smoke,
        "settings": payload_settings(args, regimes, configs, made["workers"]),
        "ci_definition": "mean ± t_{0.975, n-1} * s / sqrt(n) over seeds (Student t, sample std)",
        "verdict_rule": VERDICT_RULE,
        "skipped": skipped,
        "summary": summarise(records),
        "claims": claims_table(records),
        "failed_runs": runner.failed_runs(GRID, runs),
        "runs_total": len(records),
        "run_wall_s": common.mean_ci([r["wall_s"] for r in records if "wall_s" in r]),
        "run_cpu_s": common.mean_ci([r["cpu_s"] for r in records if "cpu_s" in r]),
    }
    return runner.close_payload(payload, made)


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    device = runner.start(args)
    settings = dict(device=device, max_steps=args.max_steps, num_train=args.num_train, num_eval=args.num_eval,
                    long_completion_length=args.long_completion_length, grad_accum=args.grad_accum,
                    long_learning_rate=args.long_learning_rate)  # fmt: skip
    grid_plan = plan(args, settings)
    regimes, configs, _ = grid_plan
    stem = "stress_smoke" if args.smoke else "stress"
    runs_path = args.output_dir / f"{stem}_runs.jsonl"
    jobs = jobs_of(regimes, configs, args.seeds)
    if not args.from_runs:
        print(f"{len(jobs)} runs ({', '.join(f'{r}: {v}' for r, v in regimes.items())}; {args.seeds} seed(s); "
              f"{args.max_steps} steps each) on {device}, {args.workers} worker(s)", flush=True)  # fmt: skip
    command = common.command_line("benchmarks.stress", argv)
    runs = runner.collect(GRID, args, jobs, settings, runs_path, command)
    payload = build_payload(args, runs, grid_plan, device, command)
    payload["table"] = print_summary(payload["summary"])
    print()
    print(claims_markdown(payload))
    json_path = common.write_json(args.output_dir / f"{stem}.json", payload)
    png = plot(payload, args.output_dir / f"{stem}.png")
    runner.print_end(payload, runs, [json_path, None if args.from_runs else runs_path, png])
    return payload


if __name__ == "__main__":
    main()
