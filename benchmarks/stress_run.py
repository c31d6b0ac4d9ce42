"""One run of the training benchmarks (`run_one`, the runner's `GRID`): a configuration trained in its regime with
one seed, its held-out accuracies and logged curves."""

from __future__ import annotations

import tempfile
import time
from typing import Any

from trl_groupopt.cli.defaults import DEMO_DEFAULTS
from trl_groupopt.comparison.runs import Grid

from . import common
from .stress_grid import MECHANISM_PREFIXES, PROBES, REGIMES, TASKS, TRL, config_of, kind_of


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
