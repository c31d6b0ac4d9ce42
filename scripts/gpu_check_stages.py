"""The Python stages of `scripts/gpu_check.sh` (docs/gpu.md): versions, short training runs, DeepSpeed, compare,
summary.

Every training unit trains one registered method (`trl_groupopt.METHODS`) on the overhead benchmark's workload
(`benchmarks.overhead`): a Qwen2.5-0.5B-shaped model with random weights built from its config in code (the task
tokenizer's ~70-token model with `--smoke`), generation replaced by fixed random completions, a cheap synthetic
reward; everything after sampling (scoring, the behaviour forward, loss, backward, optimizer) runs unchanged. A unit
records its wall time, peak CUDA memory, final loss and any error; a failing unit is recorded, never fatal to the
next, and no unit starts past `--max-seconds` (it is then recorded as not run). The JSON is rewritten after every
unit, so a stage stopped by its time cap keeps what it measured.

    python scripts/gpu_check_stages.py versions OUT/versions.json
    python scripts/gpu_check_stages.py train OUT/train.json [--smoke] [--max-seconds 120]
    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml --num_processes 1 \\
        scripts/gpu_check_stages.py train OUT/deepspeed_zero2.json --modes zero2
    python scripts/gpu_check_stages.py main-job OUT/main_job.json OUT/main_job   # reads the run's results.json
    python scripts/gpu_check_stages.py compare OUT/compare.json OUT/compare_run [--smoke]   # trl-groupopt compare
    python scripts/gpu_check_stages.py summary OUT
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ (not installed) when run as a script or under accelerate launch

#: Imported by every stage: the check fails fast when one is missing.
REQUIRED = ("torch", "transformers", "trl", "datasets", "accelerate", "trl_groupopt")
OPTIONAL = ("peft", "deepspeed", "math_verify", "pydantic", "hjson", "msgpack", "cpuinfo", "ninja", "einops")
#: mode -> (gradient checkpointing, LoRA, steps): the single-process modes, then the DeepSpeed ones (the ZeRO stage
#: itself comes from the accelerate config the process was launched with).
MODES: dict[str, tuple[bool, bool, int]] = {
    "bf16_gc": (True, False, 10),
    "lora": (True, True, 10),
    "zero2": (False, False, 5),
    "zero3": (False, False, 5),
}


def write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def versions(out: Path) -> int:
    """Versions of everything the check imports, the CUDA device and `pip list`; exit 1 if a required one fails."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable, "modules": {}}
    for name in REQUIRED + OPTIONAL:
        try:
            module = importlib.import_module(name)
            info["modules"][name] = {"version": getattr(module, "__version__", "?"), "file": module.__file__}
        except Exception as error:  # noqa: BLE001 - recorded: a missing optional one is a skip, not a crash
            info["modules"][name] = {"error": f"{type(error).__name__}: {error}"[:300]}
    import torch

    info["cuda"] = torch.cuda.is_available() and {
        "device": torch.cuda.get_device_name(0),
        "total_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
        "torch_cuda": torch.version.cuda,
        "bf16": torch.cuda.is_bf16_supported(),
    }
    try:  # what the image has beside the carried wheels (a missing optional package is a recorded skip)
        pip = subprocess.run([sys.executable, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                             timeout=20)  # fmt: skip
        info["pip_list"] = json.loads(pip.stdout) if pip.returncode == 0 else pip.stderr[-500:]
    except subprocess.TimeoutExpired:
        info["pip_list"] = "pip list took over 20 s"
    missing = [name for name in REQUIRED if "error" in info["modules"][name]]
    info["ok"] = not missing
    write(out, info)
    for name, entry in info["modules"].items():
        print(f"  {name:14s} {entry.get('version') or entry['error']}")
    print(f"  cuda: {info['cuda']}")
    if missing:
        print(f"missing required modules: {missing}", file=sys.stderr)
    return 0 if not missing else 1


def unit_args(smoke: bool, device: str, steps: int, gradient_checkpointing: bool) -> argparse.Namespace:
    """The overhead benchmark's flags for one training unit (its `config_kwargs_for` and `build_model` read them)."""
    from benchmarks import overhead

    args = overhead.parse_args(["--smoke"] if smoke else ["--device", device, "--shapes", "151936x128"])
    args.warmup, args.steps = 0, steps  # no timing here: exactly `steps` optimizer steps
    args.batch_size = min(args.batch_size, 8)  # five stages share the GPU; 8 is what the H200 run measured
    args.vocab_size, args.completion_length = args.shape_list[0][0] or None, args.shape_list[0][1]
    args.gradient_checkpointing = gradient_checkpointing
    return args


def train_unit(method: str, mode: str, smoke: bool, workdir: str) -> dict[str, Any]:
    """Train `method` for the mode's steps; returns seconds, peak memory, final loss and the settings."""
    import torch
    from transformers import PrinterCallback

    from benchmarks import overhead
    from trl_groupopt.data.offline import build_tokenizer

    gradient_checkpointing, lora, steps = MODES[mode]
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    args = unit_args(smoke, device, steps, gradient_checkpointing)
    tokenizer = build_tokenizer()
    variant = overhead.Variant(method, method)
    make_config, trainer_cls = overhead.classes(variant)
    kwargs = overhead.config_kwargs_for(variant, args, device, dtype, workdir)
    kwargs.update(logging_steps=1, learning_rate=1e-5 if lora else 1e-6)
    config = make_config(**kwargs)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    if mode.startswith("zero"):  # a fresh accelerator state (DeepSpeed plugin) per trainer; the process group stays
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated() if device == "cuda" else None  # what earlier units left allocated
    t0 = time.perf_counter()
    trainer = trainer_cls(model=overhead.build_model(args, tokenizer, device, dtype), args=config,
                          reward_funcs=overhead.synthetic_reward, processing_class=tokenizer, peft_config=peft_config,
                          train_dataset=overhead.make_prompts(64, args.prompt_length, args.seed))  # fmt: skip
    trainer._generate_single_turn = overhead.make_fake_sampler(tokenizer, args.completion_length, args.seed)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    seconds = time.perf_counter() - t0
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    record = {
        "ok": True,
        "seconds": seconds,
        "steps": trainer.state.global_step,
        "losses": losses,
        "loss_finite": bool(losses) and all(abs(x) < float("inf") for x in losses),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "allocated_at_start_bytes": held,  # on an H200 ZeRO-3 units left ~7.4 GiB each (docs/gpu.md)
        "deepspeed": trainer.is_deepspeed_enabled,
        "zero_stage": getattr(trainer.accelerator.state.deepspeed_plugin, "zero_stage", None),
        "settings": {
            "device": device,
            "dtype": str(dtype),
            "gradient_checkpointing": gradient_checkpointing,
            "lora": lora,
            "vocab_size": args.vocab_size,
            "completion_length": args.completion_length,
            "batch_size": args.batch_size,
            "model": args.model,
        },  # fmt: skip
    }
    try:  # the next unit's memory; a failure here is recorded, the training above stands
        if hasattr(trainer.model_wrapped, "destroy"):  # a DeepSpeed engine: its ZeRO-3 hooks hold the partitions
            trainer.model_wrapped.destroy()
        trainer.accelerator.free_memory()  # drops the prepared model, optimizer and DeepSpeed engine
    except Exception as error:  # noqa: BLE001
        record["cleanup_error"] = f"{type(error).__name__}: {error}"[:500]
    del trainer
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return record


def shard_of(names: list[str], shard: str) -> list[str]:
    """The K-th (from 0, shard "K/N") of N interleaved parts of `names`; together the N parts are `names`, once each."""
    k, n = map(int, shard.split("/"))
    if not 0 <= k < n:
        raise ValueError(f"--shard {shard!r}: K/N needs 0 <= K < N")
    return names[k::n]


def train(
    out: Path, modes: list[str], smoke: bool, max_seconds: float, methods: list[str] | None, shard: str = "0/1"
) -> int:
    """Every registered method (or `methods`; shard "K/N": the K-th of N interleaved parts of them) in every mode, one
    unit at a time, until `max_seconds`."""
    from benchmarks import common

    common.setup_environment()
    from trl_groupopt import METHODS

    started = time.perf_counter()
    payload: dict[str, Any] = {"stage": out.stem, "modes": modes, "smoke": smoke, "units": {}}
    import torch

    skip = None
    if any(m.startswith("zero") for m in modes):
        if smoke or not torch.cuda.is_available():
            skip = "DeepSpeed needs a GPU: accelerate 1.15 cannot drive DeepSpeed on CPU processes"
        elif importlib.util.find_spec("deepspeed") is None:
            skip = "deepspeed is not importable (scripts/gpu_wheels.sh fetches it)"
    if skip:
        payload["skipped"] = skip
        write(out, payload)
        print(payload["skipped"])
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        for mode in modes:
            for method in shard_of(methods or list(METHODS), shard):
                key = f"{method}/{mode}"
                if time.perf_counter() - started > max_seconds:
                    payload["units"][key] = {"ok": None, "not_run": f"time cap of {max_seconds:.0f} s reached"}
                else:
                    try:
                        payload["units"][key] = train_unit(method, mode, smoke, os.path.join(workdir, key))
                    except Exception as error:  # noqa: BLE001 - recorded; the next unit runs
                        payload["units"][key] = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000],
                                                 "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
                unit = payload["units"][key]
                print(f"  {key}: " + ("ok" if unit["ok"] else unit.get("not_run") or unit.get("error", "")[:300])
                      + (f" ({unit['seconds']:.1f} s, peak {common.format_bytes(unit['peak_memory_bytes'])})"
                         if unit["ok"] else ""), flush=True)  # fmt: skip
                payload["seconds"] = time.perf_counter() - started
                write(out, payload)
    return 0 if all(u["ok"] is not False for u in payload["units"].values()) else 1


def main_job(out: Path, run_dir: Path) -> int:
    """What the main job (`accelerate launch examples/train_echo.py`) left: its results.json, held-out accuracy."""
    results = run_dir / "results.json"
    payload: dict[str, Any] = {"stage": "main_job", "run_dir": str(run_dir), "ok": results.is_file()}
    if results.is_file():
        payload["results"] = json.loads(results.read_text())
    write(out, payload)
    acc = payload.get("results", {})
    print(f"  main job: held-out accuracy {acc.get('accuracy_before')} -> {acc.get('accuracy_after')}")
    return 0 if payload["ok"] else 1


def compare(out: Path, run_dir: Path, smoke: bool) -> int:
    """`trl-groupopt compare`, 2 methods x 2 seeds on the embedded policy, on every GPU found (one run per GPU at a
    time); `--smoke`: 1-step runs on the CPU with `--devices 0,1` as slots (the device pool without GPUs). Records
    each run's devices, wall time and time span, and the comparison."""
    size = ["--max_steps", "1", "--eval_examples", "8", "--devices", "0,1"] if smoke else ["--max_steps", "5",
                                                                                           "--eval_examples", "64"]  # fmt: skip
    command = [sys.executable, "-m", "trl_groupopt.cli", "compare", "--methods", "grpo,otb", "--seeds", "2",
               "--output_dir", str(run_dir), *size, "--save_strategy", "no"]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
    payload: dict[str, Any] = {"stage": "compare", "command": command, "rc": proc.returncode,
                               "seconds": time.perf_counter() - started}  # fmt: skip
    result_path = run_dir / "compare.json"
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        payload["runs"] = [{k: r.get(k) for k in ("method", "seed", "devices", "wall_s", "start_time", "end_time",
                                                  "accuracy_before", "accuracy_after", "error")}
                           for r in result["runs"]]  # fmt: skip
        payload["comparisons"] = [{k: c[k] for k in ("method", "baseline", "n", "difference", "ci95", "verdict")}
                                  for c in result["comparisons"]]  # fmt: skip
    runs = payload.get("runs", [])
    finished = [r for r in runs if not r["error"]]
    # on a GPU every run was pinned to one of them; on the CPU smoke, to one of the two slots
    payload["ok"] = proc.returncode == 0 and len(finished) == 4 and all(r["devices"] for r in finished)
    write(out, payload)
    print(f"  compare: rc={proc.returncode}, {len(finished)} runs on devices "
          f"{sorted({','.join(r['devices'] or []) for r in finished})}")  # fmt: skip
    return 0 if payload["ok"] else 1


def summary(out_dir: Path) -> int:
    """summary.json: every stage's exit status and seconds (stages.tsv, written by gpu_check.sh) and its JSON."""
    stages = {}
    table = out_dir / "stages.tsv"
    for line in table.read_text().splitlines() if table.is_file() else []:
        name, rc, seconds, cap = line.split("\t")
        path = out_dir / f"{name}.json"
        stages[name] = {"rc": int(rc), "seconds": float(seconds), "cap_seconds": float(cap),
                        "timed_out": int(rc) in (124, 137), "json": path.name if path.is_file() else None}  # fmt: skip
        if path.is_file():
            data = json.loads(path.read_text())
            units = data.get("units", {})
            stages[name].update(
                units_ok=sum(u.get("ok") is True for u in units.values()) if units else None,
                units_failed=sorted(k for k, u in units.items() if u.get("ok") is False) or None,
                skipped=data.get("skipped"),
            )
    payload = {"stages": stages, "ok": all(s["rc"] == 0 for s in stages.values())}
    write(out_dir / "summary.json", payload)
    for name, s in stages.items():
        print(f"  {name:18s} rc={s['rc']:<4d} {s['seconds']:6.0f} s (cap {s['cap_seconds']:.0f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    sub.add_parser("versions").add_argument("out", type=Path)
    p = sub.add_parser("train")
    p.add_argument("out", type=Path)
    p.add_argument("--modes", default="bf16_gc,lora", help=f"Comma-separated, of {list(MODES)}.")
    p.add_argument("--methods", help="Comma-separated registry names (default: all).")
    p.add_argument("--shard", default="0/1", help="K/N: the K-th (from 0) of N interleaved parts of the methods.")
    p.add_argument("--smoke", action="store_true", help="The task-sized model on CPU.")
    p.add_argument("--max-seconds", type=float, default=120.0, help="No unit starts after this.")
    p = sub.add_parser("main-job")
    p.add_argument("out", type=Path)
    p.add_argument("run_dir", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("out", type=Path)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--smoke", action="store_true", help="1-step runs on the CPU, --devices 0,1 as slots.")
    sub.add_parser("summary").add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    if args.stage == "versions":
        return versions(args.out)
    if args.stage == "train":
        methods = args.methods.split(",") if args.methods else None
        return train(args.out, args.modes.split(","), args.smoke, args.max_seconds, methods, args.shard)
    if args.stage == "main-job":
        return main_job(args.out, args.run_dir)
    if args.stage == "compare":
        return compare(args.out, args.run_dir, args.smoke)
    return summary(args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
