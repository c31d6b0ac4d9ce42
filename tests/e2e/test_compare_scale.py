"""`trl-groupopt compare` at scale with real runs of the train command on the embedded policy (issue 45): the device
pool on the CPU (`--devices 0,1`: two runs at once, each on its own device, none on a device another holds), and
`--seeds auto` stopping at the total its pilot planned. The Slurm launcher on a real cluster: tests/slurm/."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--max_steps", "1", "--eval_examples", "8", "--save_strategy", "no"]


def _compare(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trl_groupopt.cli", "compare", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def _runs(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    return [r for r in lines if "invocation" not in r]


def test_two_devices_run_two_runs_at_once_each_on_its_own(tmp_path):
    out = tmp_path / "cmp"
    proc = _compare("--methods", "grpo,otb", "--seeds", "2", "--devices", "0,1", "--output_dir", str(out), *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 at a time, each on 1 of devices 0,1 (on the CPU)" in proc.stdout
    runs = _runs(out)
    assert len(runs) == 4 and all(len(r["devices"]) == 1 and r["steps"] == 1 for r in runs)
    assert {r["devices"][0] for r in runs} == {"0", "1"}
    overlapping = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :]
                   if a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"]]  # fmt: skip
    assert overlapping  # two runs at once
    assert all(a["devices"] != b["devices"] for a, b in overlapping)  # never on a device another holds


def test_seeds_auto_stops_at_the_total_its_pilot_planned(tmp_path):
    scipy_stats = pytest.importorskip("scipy.stats")
    out = tmp_path / "cmp"
    argv = ["--methods", "grpo,otb", "--seeds", "auto", "--pilot_seeds", "2", "--max_seeds", "3", "--workers", "2",
            "--output_dir", str(out), *TINY]  # fmt: skip
    proc = _compare(*argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = _runs(out)
    after = {(r["method"], r["seed"]): r["accuracy_after"] for r in runs}
    pilot = [after[("otb", s)] - after[("grpo", s)] for s in range(2)]
    sd = abs(pilot[0] - pilot[1]) / math.sqrt(2)
    t = scipy_stats.t.ppf(0.975, 1)  # Stein's rule, computed here from the pilot's runs alone
    # +-1 point (half the no-difference margin), the pilot's sd taken as at least 1 point (docs/compare.md)
    planned = min(3, max(2, math.ceil((t * max(sd, 0.01) / 0.01) ** 2 - 1e-9)))
    assert sorted(after) == [(m, s) for m in ("grpo", "otb") for s in range(planned)]  # stopped at the total
    result = json.loads((out / "compare.json").read_text())
    assert result["seed_plan"]["total"] == planned and result["comparisons"][0]["n"] == planned
    assert f"planned total **{planned} seeds**" in (out / "compare.md").read_text()
    again = _compare(*argv)  # the same plan from the same pilot: nothing more runs
    assert again.returncode == 0 and len(_runs(out)) == len(runs)


def test_the_devices_benchmark_help_imports_no_torch():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compare_devices", "--help"], cwd=REPO, text=True,
                          capture_output=True, timeout=120, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})  # fmt: skip
    assert proc.returncode == 0 and "--repeats" in proc.stdout, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}  # fmt: skip
    assert not imported & {"torch", "trl", "transformers", "datasets"}
