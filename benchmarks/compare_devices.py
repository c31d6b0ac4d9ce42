"""How much sooner does `trl-groupopt compare` finish on two devices than on one? A 2-method x 4-seed comparison on the
embedded policy with `--devices 0,1` (two runs at once, each pinned to its own device) against `--devices 0` (one at a
time), in the same invocation, in ABBA order so a drift of the machine's load falls on both alike.

On a machine without CUDA the devices are slots of the scheduler and the runs train on the CPU (one torch thread
each): the figure is then the device pool's concurrency on the cores, the same mechanism that puts runs on the free
GPUs of a node (docs/compare.md, "On a node with several GPUs").

    python -m benchmarks.compare_devices                 # writes benchmarks/results/compare_devices.json
    python -m benchmarks.compare_devices --repeats 1 --seeds 2 --max-steps 1 --output-dir /tmp/x   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_OUTPUT_DIR, REPO, command_line, mean, write_json

CONFIGS = {"one device": "0", "two devices": "0,1"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds per method (default 4: 8 runs)")
    parser.add_argument("--max-steps", type=int, default=3, help="optimizer steps per run (default 3)")
    parser.add_argument("--eval-examples", type=int, default=64, help="held-out prompts per run (default 64)")
    parser.add_argument("--repeats", type=int, default=2, help="ABBA pairs: each configuration this many times")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    return parser.parse_args(argv)


def one_comparison(devices: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One `trl-groupopt compare` in a fresh folder: its wall time, and its runs' spans and devices."""
    out = workdir / f"devices-{devices.replace(',', '_')}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "trl_groupopt.cli", "compare", "--methods", "grpo,otb", "--seeds",
               str(args.seeds), "--devices", devices, "--max_steps", str(args.max_steps), "--eval_examples",
               str(args.eval_examples), "--save_strategy", "no", "--output_dir", str(out)]  # fmt: skip
    load, started = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"compare failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    runs = [r for r in json.loads((out / "compare.json").read_text())["runs"] if "error" not in r]
    spans = [(r["start_time"], r["end_time"]) for r in runs]
    busy = sum(end - start for start, end in spans)  # run-seconds; / wall = runs at once on average
    return {"devices": devices, "wall_s": wall, "runs": len(runs), "run_wall_s": mean([r["wall_s"] for r in runs]),
            "run_cpu_s": mean([r["cpu_s"] for r in runs]), "runs_at_once": busy / wall,
            "devices_used": sorted({d for r in runs for d in r["devices"] or []}), "load_before": load}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    order = [name for i in range(args.repeats) for name in (list(CONFIGS) if i % 2 == 0 else list(CONFIGS)[::-1])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="compare_devices-") as workdir:
        for name in order:
            row = {"config": name, **one_comparison(CONFIGS[name], args, Path(workdir))}
            rows.append(row)
            print(f"  {name:12s} {row['wall_s']:6.1f} s wall, {row['runs_at_once']:.2f} runs at once, "
                  f"{row['run_wall_s']:.1f} s per run", flush=True)  # fmt: skip
    walls = {name: mean([r["wall_s"] for r in rows if r["config"] == name]) for name in CONFIGS}
    payload = {
        "command": command_line("benchmarks.compare_devices", argv),
        "question": "wall time of a 2-method comparison with --devices 0,1 against --devices 0, in the same run",
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "note": "no CUDA: the devices are the scheduler's slots, the runs train on the CPU",
        },  # fmt: skip
        "settings": {
            "methods": ["grpo", "otb"],
            "seeds": args.seeds,
            "max_steps": args.max_steps,
            "eval_examples": args.eval_examples,
            "repeats": args.repeats,
            "order": order,
        },  # fmt: skip
        "rows": rows,
        "wall_s": walls,
        "speedup": walls["one device"] / walls["two devices"],
    }
    print(f"\n| configuration | wall s (mean of {args.repeats}) | runs at once |\n|---|---:|---:|")
    for name in CONFIGS:
        at_once = mean([r["runs_at_once"] for r in rows if r["config"] == name])
        print(f"| {name} (--devices {CONFIGS[name]}) | {walls[name]:.1f} | {at_once:.2f} |")
    print(f"\ntwo devices finish {payload['speedup']:.2f}x sooner than one")
    path = write_json(args.output_dir / "compare_devices.json", payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
