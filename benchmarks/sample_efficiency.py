"""Sample efficiency of TRL GRPO/GSPO and the trl-groupopt methods on the synthetic arithmetic task.

Every method trains the embedded tiny policy (`trl_groupopt.offline.EMBEDDED_POLICY_PATH`, ~32% held-out greedy
accuracy) with the same budget, learning rate and schedule (`trl_groupopt.cli.DEMO_DEFAULTS`: lr 1e-4 constant,
4 prompts x 4 completions per micro-batch, 2 micro-batches per step, completions up to 48 tokens, no KL), off-policy
with `steps_per_generation = 4 x gradient_accumulation_steps` (each generation batch feeds 4 optimizer steps),
rewards = `accuracy_reward + format_reward` as in the demo. No per-method tuning: each method keeps its own
paper's defaults for its own knobs (clip ranges, transforms) and nothing else changes. Methods:

  grpo              TRL GRPOTrainer, GRPOConfig defaults (loss_type "dapo", epsilon 0.2)
  gspo              TRL GRPOTrainer with importance_sampling_level="sequence", epsilon 3e-4, epsilon_high 4e-4,
                    loss_type "grpo" (GSPO paper v2, Sec. 5.1; TRL's paper index)
  every other registered method (`trl_groupopt.METHODS`: ctpo, grpo_fix, echo, otb, ...) with its registered
                    trainer and defaults; DFPO as dfpo_min_replace (its default) and dfpo_orth_proj
  grpo_n16          TRL GRPO with N = 16 completions per prompt and the same 4 prompts per micro-batch (4x the
                    samples): with grpo (N = 4) and otb (N = 4), the OTB paper's claim that its baseline at small N
                    matches a group-mean baseline at large N.

Recorded per run (method x seed): the training reward and entropy per logged step from `trainer.state.log_history`
(the reward is logged once per generation batch, i.e. every steps_per_generation / gradient_accumulation_steps = 4
steps), and held-out greedy accuracy (`trl_groupopt.offline.greedy_accuracy` on the "test" split) at step 0 and every
`--eval-every` steps. Summaries per method, mean and 95% Student-t CI over seeds:
- final held-out accuracy;
- steps to reach GRPO's final accuracy (the mean over GRPO's seeds): the first evaluation step at or above it, per
  seed (None if never), and on the seed-mean curve;
- Jitter2 of the training-reward curve, exactly as printed in Ding et al. (DFPO), arXiv:2604.13088, Eq. 20:
  Jitter2(m) = 1/(T-2) sum_{t=1}^{T-2} |m_{t+2} - 2 m_{t+1} + m_t|, with m_t the t-th logged training reward.

Runs go through the library's runner (`trl_groupopt.runs`, via `benchmarks.runner`), keyed by method and seed in
`sample_efficiency_runs.jsonl`: the same command resumes; `--from-runs` rebuilds the JSON and plots without training.

Usage:
    python -m benchmarks.sample_efficiency --smoke --output-dir outputs/bench        # 2 methods x 1 seed x 3 steps
    python -m benchmarks.sample_efficiency --device cpu --workers 2 --fresh       # the committed grid (~20 min)
    python -m benchmarks.sample_efficiency --from-runs benchmarks/results/sample_efficiency_runs.jsonl
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from trl_groupopt import METHODS as REGISTERED

from . import common, runner

GSPO_EPSILONS = dict(epsilon=3e-4, epsilon_high=4e-4)  # GSPO paper v2, Sec. 5.1
# name -> (label, config class, trainer class, overrides); "trl." = trl.GRPOConfig / trl.GRPOTrainer, "@name" the
# registered method's config (with its `config_defaults`) and trainer.
VARIANTS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "grpo": ("TRL GRPO", "trl.GRPOConfig", "trl.GRPOTrainer", {}),
    "gspo": ("TRL GSPO", "trl.GRPOConfig", "trl.GRPOTrainer",
             {"importance_sampling_level": "sequence", "loss_type": "grpo", **GSPO_EPSILONS}),
    "dfpo_min_replace": ("DFPO min_replace", "@dfpo", "@dfpo", {"dfpo_transform": "min_replace"}),
    "dfpo_orth_proj": ("DFPO orth_proj", "@dfpo", "@dfpo", {"dfpo_transform": "orth_proj"}),
    "grpo_n16": ("TRL GRPO (N=16)", "trl.GRPOConfig", "trl.GRPOTrainer", {"num_generations": 16}),
}  # fmt: skip
#: The registered methods a variant runs (TRL's GRPOTrainer stands for the base trainer with TRL's objective).
RUN_AS = {"grpo": "grpo", "dfpo": "dfpo_min_replace"}
#: Every registered method (`trl_groupopt.METHODS`) at its defaults, besides the variants.
METHODS = {
    **{k: VARIANTS[k] for k in ("grpo", "gspo")},
    **{
        name: (spec.display_name, f"@{name}", f"@{name}", {})
        for name, spec in REGISTERED.items()
        if name not in RUN_AS
    },
    **{k: VARIANTS[k] for k in ("dfpo_min_replace", "dfpo_orth_proj", "grpo_n16")},
}
BASELINE = "grpo"
OTB_CLAIM = ("otb", "grpo", "grpo_n16")
SMOKE_METHODS = ("grpo", "otb")
LOGGED_EXTRAS = ("rewards/accuracy_reward/mean", "rewards/format_reward/mean", "completions/mean_length",
                 "clip_ratio/region_mean", "otb/grad_second_moment", "otb/grad_second_moment_group_mean_baseline")  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Sample efficiency of TRL GRPO/GSPO and the trl-groupopt methods on the synthetic arithmetic "
        "task with the embedded tiny policy (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR, help="Where JSON, JSONL and PNG go."
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"{len(SMOKE_METHODS)} methods x 1 seed x 3 steps on CPU."
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="Where the tiny policy trains. For this 1M-parameter model one CPU core per run and "
                             "--workers runs many runs at once; a GPU serves one run at a time (not measured faster).")  # fmt: skip
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="Comma-separated subset of: " + ", ".join(METHODS)
    )
    parser.add_argument("--seeds", type=int, default=3, help="Seeds per method (0..seeds-1).")
    parser.add_argument("--max-steps", type=int, default=100, help="Optimizer steps per run (the budget).")
    parser.add_argument("--eval-every", type=int, default=10, help="Held-out greedy accuracy every this many steps.")
    parser.add_argument("--num-train", type=int, default=2000, help="Training prompts (synthetic, split 'train').")
    parser.add_argument("--num-eval", type=int, default=200, help="Held-out prompts (split 'test').")
    parser.add_argument("--learning-rate", type=float, help="Shared by all methods (default: the demo's).")
    runner.add_grid_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.methods = ",".join(SMOKE_METHODS) if args.methods == ",".join(METHODS) else args.methods
        args.seeds, args.max_steps, args.eval_every = 1, 3, 3
        args.num_train, args.num_eval = 64, 16
        if args.device == "auto":
            args.device = "cpu"
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if args.seeds < 1 or args.max_steps < 1 or args.eval_every < 1:
        parser.error("--seeds, --max-steps and --eval-every must be >= 1")
    return args


# ------------------------------------------------------------------------------------------------ one run
def run_config(method: str, seed: int, settings: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """The config kwargs of one run: the demo defaults, the shared budget, then the method's own overrides."""
    kwargs = runner.demo_config(settings, seed, output_dir)
    # off-policy: each generation batch feeds 4 optimizer steps
    kwargs["steps_per_generation"] = 4 * kwargs["gradient_accumulation_steps"]
    if settings.get("learning_rate") is not None:
        kwargs["learning_rate"] = settings["learning_rate"]
    overrides = dict(METHODS[method][3])
    if "num_generations" in overrides:  # equal prompts per micro-batch: scale the micro-batch with N
        prompts_per_micro_batch = kwargs["per_device_train_batch_size"] // kwargs["num_generations"]
        overrides["per_device_train_batch_size"] = prompts_per_micro_batch * overrides["num_generations"]
    kwargs.update(overrides)
    return kwargs


def run_one(method: str, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Train one method with one seed; return its curves (picklable, JSON-ready)."""
    common.setup_environment()
    started = time.perf_counter()
    device = common.resolve_device(settings["device"])
    import transformers
    import trl
    from transformers import PrinterCallback, TrainerCallback

    import trl_groupopt
    from trl_groupopt import offline, rewards

    transformers.logging.set_verbosity_error()
    label, config_name, trainer_name, _ = METHODS[method]

    if config_name.startswith("@"):  # a registered method: its config defaults, then the run's settings
        spec = trl_groupopt.get_method(config_name[1:])
        config_cls, trainer_cls = spec.make_config, spec.trainer_class
    else:
        config_cls, trainer_cls = getattr(trl, config_name[4:]), getattr(trl, trainer_name[4:])
    train_set = offline.make_arithmetic_dataset(settings["num_train"], seed=0, split="train")
    eval_set = offline.make_arithmetic_dataset(settings["num_eval"], seed=0, split="test")
    accuracy: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix=f"se-{method}-{seed}-") as workdir:
        config = config_cls(**run_config(method, seed, settings, workdir))
        trainer = trainer_cls(
            model=offline.EMBEDDED_POLICY_PATH,
            reward_funcs=[rewards.accuracy_reward, rewards.format_reward],
            args=config,
            train_dataset=train_set,
        )
        trainer.remove_callback(PrinterCallback)

        def evaluate(step: int) -> None:
            # Greedy decoding consumes no random numbers, so evaluating does not change the training samples.
            result = offline.greedy_accuracy(trainer.model, trainer.processing_class, eval_set,
                                          max_new_tokens=config.max_completion_length)  # fmt: skip
            accuracy.append({"step": step, "accuracy": result["accuracy"], "format_rate": result["format_rate"]})

        class Evaluator(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                evaluate(0)

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % settings["eval_every"] == 0 or state.global_step == args.max_steps:
                    evaluate(state.global_step)

        trainer.add_callback(Evaluator())
        train_started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - train_started
        history = list(trainer.state.log_history)

    def series(key: str) -> dict[str, list]:
        points = [(e["step"], e[key]) for e in history if key in e and e[key] is not None and "train_runtime" not in e]
        return {"steps": [int(s) for s, _ in points], "values": [float(v) for _, v in points]}

    return {
        "method": method,
        "label": label,
        "seed": seed,
        "device": device,
        "device_info": common.describe_device(device),
        "num_generations": config.num_generations,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "reward": series("reward"),
        "entropy": series("entropy"),
        "extras": {key: series(key) for key in LOGGED_EXTRAS if any(key in e for e in history)},
        "accuracy": {
            "steps": [a["step"] for a in accuracy],
            "values": [a["accuracy"] for a in accuracy],
            "format_rate": [a["format_rate"] for a in accuracy],
        },
        "train_s": train_s,
        "wall_s": time.perf_counter() - started,
    }


def describe(run: dict[str, Any]) -> str:
    """A finished run in the progress log."""
    acc = run["accuracy"]["values"]
    return f"accuracy {acc[0]:.1%} -> {acc[-1]:.1%}, {run['train_s']:.0f} s training, {run['wall_s']:.0f} s in all"


GRID = runner.Grid(("method", "seed"), run_one, describe)


def jobs_of(methods: list[str], seeds: int) -> list[tuple[str, int]]:
    """(method, seed) for every run, longest first (N=16 runs cost ~4x) so the pool ends together."""
    jobs = [(m, s) for m in methods for s in range(seeds)]
    jobs.sort(key=lambda job: -METHODS[job[0]][3].get("num_generations", 4))
    return jobs


# ------------------------------------------------------------------------------------------------ summaries
def summarise(runs: list[dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    by_method = {m: sorted((r for r in ok if r["method"] == m), key=lambda r: r["seed"]) for m in methods}
    by_method = {m: rs for m, rs in by_method.items() if rs}
    baseline_final = [r["accuracy"]["values"][-1] for r in by_method.get(BASELINE, [])]
    threshold = common.mean_ci(baseline_final)["mean"]
    summary: dict[str, Any] = {}
    for method, rs in by_method.items():
        finals = [r["accuracy"]["values"][-1] for r in rs]
        jitters = [common.jitter2(r["reward"]["values"]) for r in rs]
        acc_jitters = [common.jitter2(r["accuracy"]["values"]) for r in rs]
        mean_acc = common.mean_curve([r["accuracy"] for r in rs])
        entry: dict[str, Any] = {
            "label": METHODS[method][0],
            "seeds": [r["seed"] for r in rs],
            "num_generations": rs[0]["num_generations"],
            "per_device_train_batch_size": rs[0]["per_device_train_batch_size"],
            "final_accuracy": {**common.mean_ci(finals), "per_seed": finals},
            "initial_accuracy": common.mean_ci([r["accuracy"]["values"][0] for r in rs]),
            "jitter2_reward": {**common.mean_ci(jitters), "per_seed": jitters},
            "jitter2_accuracy": {**common.mean_ci(acc_jitters), "per_seed": acc_jitters},
            "final_train_reward": common.mean_ci(
                [r["reward"]["values"][-1] if r["reward"]["values"] else None for r in rs]
            ),
            "mean_entropy": common.mean_ci(
                [
                    sum(r["entropy"]["values"]) / len(r["entropy"]["values"]) if r["entropy"]["values"] else None
                    for r in rs
                ]
            ),  # fmt: skip
            "train_s": common.mean_ci([r["train_s"] for r in rs]),
            "curves": {
                "reward": [r["reward"] for r in rs],
                "entropy": [r["entropy"] for r in rs],
                "accuracy": [r["accuracy"] for r in rs],
            },
            "mean_accuracy_curve": mean_acc,
        }
        if threshold is not None:
            per_seed = [
                common.first_step_reaching(r["accuracy"]["steps"], r["accuracy"]["values"], threshold) for r in rs
            ]
            entry["steps_to_threshold"] = {
                **common.mean_ci([s for s in per_seed if s is not None]),
                "per_seed": per_seed,
                "reached": sum(s is not None for s in per_seed),
                "of": len(per_seed),
                "on_mean_curve": common.first_step_reaching(mean_acc["steps"], mean_acc["mean"], threshold),
            }
        for key in ("otb/grad_second_moment", "otb/grad_second_moment_group_mean_baseline"):
            values = [v for r in rs for v in r["extras"].get(key, {}).get("values", [])]
            if values:
                entry.setdefault("variance_proxy", {})[key] = sum(values) / len(values)
        summary[method] = entry
    return {"threshold_accuracy": threshold, "methods": summary}


def otb_claim(summary: dict[str, Any]) -> dict[str, Any] | None:
    methods = summary["methods"]
    if not all(m in methods for m in OTB_CLAIM):
        return None
    rows = {}
    for m in OTB_CLAIM:
        e = methods[m]
        rows[m] = {
            "num_generations": e["num_generations"],
            "final_accuracy": e["final_accuracy"]["mean"],
            "final_accuracy_ci95": e["final_accuracy"]["ci95"],
            "steps_to_threshold_on_mean_curve": e.get("steps_to_threshold", {}).get("on_mean_curve"),
        }
    return {
        "claim": "OTB with N=4 matches a group-mean baseline (GRPO) with a larger group (paper: N=32; here N=16) "
                 "at an equal number of prompts per step",
        "rows": rows,
        "otb_minus_grpo_n16_final_accuracy": rows["otb"]["final_accuracy"] - rows["grpo_n16"]["final_accuracy"],
        "otb_minus_grpo_n4_final_accuracy": rows["otb"]["final_accuracy"] - rows["grpo"]["final_accuracy"],
    }  # fmt: skip


def plot(payload: dict[str, Any], output_dir: Path) -> list[Path]:
    plt = common.pyplot()
    if plt is None:
        return []
    methods = payload["summary"]["methods"]
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    written = []

    def band(ax, curves, color, label):
        mc = common.mean_curve(curves)
        if not mc["steps"]:
            return
        ax.plot(mc["steps"], mc["mean"], color=color, label=label, linewidth=1.4)
        if any(lo != hi for lo, hi in zip(mc["low"], mc["high"])):
            ax.fill_between(mc["steps"], mc["low"], mc["high"], color=color, alpha=0.15, linewidth=0)

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for m, e in methods.items():
        label = f"{m} (n={len(e['seeds'])})"
        band(axes[0], e["curves"]["reward"], colors[m], label)
        band(axes[1], e["curves"]["accuracy"], colors[m], label)
        band(axes[2], e["curves"]["entropy"], colors[m], label)
    threshold = payload["summary"]["threshold_accuracy"]
    if threshold is not None:
        axes[1].axhline(threshold, color="black", linestyle=":", linewidth=1, label="GRPO final (threshold)")
    for ax, title in zip(axes, ("training reward (accuracy + format)", "held-out greedy accuracy", "token entropy")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"Sample efficiency, embedded tiny policy, mean and 95% CI over seeds ({payload['device']['description']})",
                 fontsize=10)  # fmt: skip
    written.append(common.save_figure(fig, output_dir / "sample_efficiency.png", dpi=120))

    if payload.get("otb_claim"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for m in OTB_CLAIM:
            e = methods[m]
            label = f"{METHODS[m][0]} (n={len(e['seeds'])})"
            band(axes[0], e["curves"]["accuracy"], colors[m], label)
            band(axes[1], e["curves"]["reward"], colors[m], label)
        axes[0].set_title("held-out greedy accuracy", fontsize=10)
        axes[1].set_title("training reward", fontsize=10)
        for ax in axes:
            ax.set_xlabel("optimizer step")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle("OTB (N=4) vs group-mean baseline (GRPO) with N=4 and N=16, equal prompts per step", fontsize=10)
        written.append(common.save_figure(fig, output_dir / "sample_efficiency_otb.png", dpi=120))
    return written


def build_payload(args: argparse.Namespace, runs: runner.Runs, settings: dict[str, Any],
                  command: str) -> dict[str, Any]:  # fmt: skip
    """sample_efficiency.json: the settings, the summary per method, the OTB claim and where the runs came from."""
    from trl_groupopt.cli import DEMO_DEFAULTS

    present = {r["method"] for r in runs.records}
    methods = [m for m in args.methods if m in present] + [m for m in METHODS if m in present - set(args.methods)]
    summary = summarise(runs.records, methods)
    made = runner.provenance(runs, command, args.workers)
    device = next((r["device"] for r in runs.records if "device" in r), settings["device"])
    example = run_config(methods[0], 0, {**settings, "device": device}, "<tmp>") if methods else {}
    payload: dict[str, Any] = {
        "benchmark": "sample_efficiency",
        "device": runner.recorded_device(runs, device),
        "command": made["command"],
        "smoke": args.smoke,
        "settings": {
            "seeds": args.seeds,
            "max_steps": args.max_steps,
            "eval_every": args.eval_every,
            "num_train": args.num_train,
            "num_eval": args.num_eval,
            "workers": made["workers"],
            "policy": "trl_groupopt.offline.EMBEDDED_POLICY_PATH",
            "shared_config": {
                k: v for k, v in example.items() if k not in ("output_dir", "seed", "model_init_kwargs")
            },
            "demo_defaults": DEMO_DEFAULTS,
            "method_overrides": {m: METHODS[m][3] for m in methods},
            "rewards": ["accuracy_reward", "format_reward"],
            "reward_curve": "training reward logged by TRL once per generation batch (every 4 optimizer steps)",
        },  # fmt: skip
        "jitter2_definition": common.JITTER2_CITATION,
        "ci_definition": "mean ± t_{0.975, n-1} * s / sqrt(n) over seeds (Student t, sample std)",
        "summary": summary,
        "otb_claim": otb_claim(summary),
        "failed_runs": runner.failed_runs(GRID, runs),
    }
    return runner.close_payload(payload, made)


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    device = runner.start(args)
    settings = dict(device=device, max_steps=args.max_steps, eval_every=args.eval_every, num_train=args.num_train,
                    num_eval=args.num_eval, learning_rate=args.learning_rate)  # fmt: skip
    if not args.from_runs:
        print(f"{len(args.methods)} method(s) x {args.seeds} seed(s) x {args.max_steps} steps on {device}, "
              f"{args.workers} worker(s)", flush=True)  # fmt: skip
    command = common.command_line("benchmarks.sample_efficiency", argv)
    runs_path = args.output_dir / "sample_efficiency_runs.jsonl"
    runs = runner.collect(GRID, args, jobs_of(args.methods, args.seeds), settings, runs_path, command)
    payload = build_payload(args, runs, settings, command)
    if payload["otb_claim"]:
        c = payload["otb_claim"]
        print(f"OTB claim: final accuracy OTB(N=4) - GRPO(N=16) = {c['otb_minus_grpo_n16_final_accuracy']:+.1%}, "
              f"OTB(N=4) - GRPO(N=4) = {c['otb_minus_grpo_n4_final_accuracy']:+.1%}")  # fmt: skip
    json_path = common.write_json(args.output_dir / "sample_efficiency.json", payload)
    runner.print_end(
        payload, runs, [json_path, None if args.from_runs else runs_path, *plot(payload, args.output_dir)]
    )
    return payload


if __name__ == "__main__":
    main()
