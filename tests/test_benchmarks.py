"""The benchmark scripts run: `--help`, and `--smoke` on CPU as subprocesses (JSON schema, PNGs), plus their
statistics helpers (Jitter2 as printed in the DFPO paper's Eq. 20, the Student-t CI) against independent values.

Smoke outputs go to pytest's tmp_path, never to benchmarks/results/. About 50 s on a 2-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load(name: str):
    """Import a benchmarks/ module by path (benchmarks/ is not a package)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(script: str, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))  # fmt: skip
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------------------------------------ helpers (fast)
def test_jitter2_matches_eq20_by_hand():
    common = _load("common")
    # m = (0, 1, 0, 1): second differences m3 - 2 m2 + m1 = -2 and m4 - 2 m3 + m2 = 2 -> mean |.| = 2 over T - 2 = 2
    assert common.jitter2([0.0, 1.0, 0.0, 1.0]) == pytest.approx(2.0)
    # m = (1, 4, 9, 16, 25): second differences of squares are all 2
    assert common.jitter2([1, 4, 9, 16, 25]) == pytest.approx(2.0)
    # any straight line has zero jitter; a constant offset and a linear trend change nothing
    assert common.jitter2([3.0 + 0.5 * t for t in range(10)]) == pytest.approx(0.0, abs=1e-12)
    curve = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    shifted = [m + 5.0 - 0.25 * t for t, m in enumerate(curve)]
    assert common.jitter2(shifted) == pytest.approx(common.jitter2(curve))
    # hand sum for the curve above: |0.7-0.2+0.3| + |0.2-1.4+0.1| + |0.9-0.4+0.7| + |0.4-1.8+0.2| = 0.8+1.1+1.2+1.2
    assert common.jitter2(curve) == pytest.approx(4.3 / 4)
    assert math.isnan(common.jitter2([1.0, 2.0]))


def test_mean_ci_matches_student_t():
    scipy_stats = pytest.importorskip("scipy.stats")
    common = _load("common")
    for df in (1, 2, 3, 4, 9, 29):
        assert common.t_quantile_975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-3)
    values = [0.31, 0.42, 0.38]
    stats = common.mean_ci(values + [None, float("nan")])  # missing seeds are ignored
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    assert stats["n"] == 3 and stats["mean"] == pytest.approx(mean)
    assert stats["ci95"] == pytest.approx(scipy_stats.t.ppf(0.975, 2) * std / math.sqrt(3), rel=1e-3)
    assert stats["low"] == pytest.approx(mean - stats["ci95"]) and stats["high"] == pytest.approx(mean + stats["ci95"])
    single = common.mean_ci([0.5])
    assert single["mean"] == 0.5 and single["ci95"] is None
    assert common.mean_ci([])["mean"] is None
    assert common.first_step_reaching([0, 10, 20], [0.2, 0.5, 0.4], 0.45) == 10
    assert common.first_step_reaching([0, 10], [0.2, 0.3], 0.45) is None


# ------------------------------------------------------------------------------------------------ the scripts
@pytest.mark.parametrize("script", ["overhead.py", "sample_efficiency.py"])
def test_help(script):
    out = _run(script, "--help", timeout=60).stdout
    for flag in ("--output-dir", "--smoke", "--device"):
        assert flag in out
    assert (
        ("--steps" in out and "--warmup" in out)
        if script == "overhead.py"
        else ("--seeds" in out and "--eval-every" in out)
    )


@pytest.mark.slow
def test_overhead_smoke(tmp_path):
    overhead = _load("overhead")
    proc = _run("overhead.py", "--smoke", "--output-dir", str(tmp_path))
    payload = json.loads((tmp_path / "overhead.json").read_text())
    assert payload["benchmark"] == "overhead" and payload["smoke"] is True
    assert payload["device"]["type"] == "cpu" and payload["device"]["description"]
    assert "overhead.py" in payload["command"] and "--smoke" in payload["command"]
    assert payload["memory_kind"].startswith("cpu_")
    results = payload["results"]
    assert set(results) == set(overhead.TRAINERS)  # TRL's GRPOTrainer and every one of ours
    assert all(payload[name] == results[name] for name in overhead.TRAINERS)  # also keyed by name at the top
    for name, entry in results.items():
        for key in ("time_ms", "time_ratio", "train_time_ms", "train_time_ratio", "scoring_ms_per_step",
                    "peak_memory_bytes", "memory_ratio", "timed_steps"):  # fmt: skip
            assert isinstance(entry[key], (int, float)) and entry[key] > 0, (name, key, entry[key])
        assert entry["timed_steps"] >= payload["settings"]["timed_steps"]
        assert entry["time_ms"] == pytest.approx(entry["train_time_ms"] + entry["scoring_ms_per_step"])
        assert entry["off_policy"] is True  # the behaviour forward (old_per_token_logps) ran, as in real training
        assert entry["target_time_ratio"] == (overhead.TARGETS[name][0] if name in overhead.TARGETS else None)
    assert results["grpo"]["time_ratio"] == pytest.approx(1.0) and results["grpo"]["memory_ratio"] == pytest.approx(
        1.0
    )
    assert results["echo"]["time_ratio"] == pytest.approx(results["echo"]["time_ms"] / results["grpo"]["time_ms"])
    assert results["otb"]["otb_energy_from_behaviour_forward"] is True
    assert results["otb"]["target_time_ratio"] == 1.05
    assert _is_png(tmp_path / "overhead.png")
    assert "x GRPO" in proc.stdout and "otb" in proc.stdout  # the printed table

    # --plot-from re-draws the PNG from the JSON alone
    (tmp_path / "overhead.png").unlink()
    overhead.main(["--plot-from", str(tmp_path / "overhead.json"), "--output-dir", str(tmp_path)])
    assert _is_png(tmp_path / "overhead.png")


@pytest.mark.slow
def test_sample_efficiency_smoke(tmp_path):
    se = _load("sample_efficiency")
    _run("sample_efficiency.py", "--smoke", "--output-dir", str(tmp_path))
    payload = json.loads((tmp_path / "sample_efficiency.json").read_text())
    assert payload["benchmark"] == "sample_efficiency" and payload["smoke"] is True
    assert payload["device"]["type"] == "cpu" and "sample_efficiency.py" in payload["command"]
    assert "Eq. 20" in payload["jitter2_definition"]
    shared = payload["settings"]["shared_config"]
    assert shared["steps_per_generation"] == 4 * shared["gradient_accumulation_steps"]  # off-policy, 4x
    assert payload["failed_runs"] == []
    methods = payload["summary"]["methods"]
    assert set(methods) == set(se.SMOKE_METHODS)
    grpo_final = methods["grpo"]["final_accuracy"]["per_seed"]
    assert payload["summary"]["threshold_accuracy"] == pytest.approx(sum(grpo_final) / len(grpo_final))
    for name, entry in methods.items():
        assert entry["seeds"] == [0]
        for key in ("final_accuracy", "jitter2_reward", "steps_to_threshold", "initial_accuracy"):
            assert {"mean", "ci95", "n"} <= set(entry[key]), (name, key)
        (accuracy,) = entry["curves"]["accuracy"]
        assert accuracy["steps"] == [0, 3] and all(0.0 <= a <= 1.0 for a in accuracy["values"])
        (reward,) = entry["curves"]["reward"]
        assert reward["steps"] and reward["steps"][0] == 1  # logged at the first step of each generation batch
        (entropy,) = entry["curves"]["entropy"]
        assert entropy["steps"] == [1, 2, 3] and all(v > 0 for v in entropy["values"])
        assert entry["final_accuracy"]["per_seed"] == [accuracy["values"][-1]]
        assert entry["steps_to_threshold"]["of"] == 1
    # both methods start from the same policy: identical greedy accuracy at step 0
    assert (
        methods["grpo"]["curves"]["accuracy"][0]["values"][0] == methods["otb"]["curves"]["accuracy"][0]["values"][0]
    )
    assert _is_png(tmp_path / "sample_efficiency.png")
    runs_path = tmp_path / "sample_efficiency_runs.jsonl"
    assert len(runs_path.read_text().splitlines()) == 2

    # --from-runs rebuilds the same summary without training
    rebuilt_dir = tmp_path / "rebuilt"
    rebuilt = se.main(["--smoke", "--from-runs", str(runs_path), "--output-dir", str(rebuilt_dir)])
    assert rebuilt["summary"]["threshold_accuracy"] == pytest.approx(payload["summary"]["threshold_accuracy"])
    assert _is_png(rebuilt_dir / "sample_efficiency.png")
