"""The training benchmarks' grids as data: the configurations (`CONFIGS`, `SE_CONFIGS`), the regimes and their knobs
(`REGIMES`), the grids (`GRIDS`), the mechanism metrics kept per method, and each paper's claim (`CLAIMS`, read from
`claims.jsonl`, with its planned seeds `CLAIM_SEEDS`), the probe and the verdict and stage rules. Run by
`benchmarks.stress` (benchmarks/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from trl_groupopt import METHODS
from trl_groupopt.comparison import stats
from trl_groupopt.data.offline import VARIANTS as TASKS

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


def config_of(regime: str, name: str) -> Config:
    return REGIMES[regime].get("table", CONFIGS)[name]


def kind_of(regime: str) -> str:
    return REGIMES[regime].get("kind", regime)
