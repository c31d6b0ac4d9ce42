"""`trl-groupopt compare` end to end on the embedded policy, on the CPU (issue 39's acceptance): the four files from
real runs of the train command, a re-run that skips every done run, every registered method paired with the
baseline through real runs, and the Python twin on a user's dataset (the held-out rows carved from it and scored on
each saved model)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trl_groupopt
from tests.environment import process_environment
from tests.selection import tested_methods
from trl_groupopt.data.offline import make_arithmetic_dataset

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASELINE = "grpo"  # compare's default --baseline


def _run(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env=process_environment())  # fmt: skip


@functools.cache
def _entry() -> list[str]:
    """`trl-groupopt compare` (`python -m trl_groupopt.cli compare`) once the CLI dispatches it, else the module."""
    dispatched = _run("trl_groupopt.cli", "compare", "--help")
    return ["trl_groupopt.cli", "compare"] if "--eval_examples" in dispatched.stdout else ["trl_groupopt.compare"]


def _compare(*argv: str) -> subprocess.CompletedProcess:
    return _run(*_entry(), *argv)


def test_compare_writes_the_four_files_and_a_rerun_skips_every_done_run(tmp_path):
    out = tmp_path / "cmp"
    argv = ["--methods", "grpo,otb", "--seeds", "2", "--max_steps", "3", "--output_dir", str(out)]
    first = _compare(*argv)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for name in ("runs.jsonl", "compare.json", "compare.md", "compare.png"):
        assert (out / name).is_file(), name
    assert (out / "compare.png").read_bytes()[:8] == PNG_MAGIC
    result = json.loads((out / "compare.json").read_text())
    runs = [r for r in result["runs"] if "error" not in r]
    assert sorted((r["method"], r["seed"]) for r in runs) == [("grpo", 0), ("grpo", 1), ("otb", 0), ("otb", 1)]
    for run in runs:  # each run trained through the train command and scored on the shared split
        assert run["steps"] == 3 and run["heldout_examples"] == 200 and run["cpu_s"] > 0 and run["wall_s"] > 0
        assert 0.0 <= run["accuracy_after"] <= 1.0 and run["acted"]["steps"] == 3
        assert (Path(run["output_dir"]) / "results.json").is_file()
    assert len({r["accuracy_before"] for r in runs}) == 1  # one held-out split, one starting policy
    (row,) = result["comparisons"]
    assert (row["method"], row["baseline"], row["n"]) == ("otb", "grpo", 2) and len(row["per_seed"]) == 2
    assert row["verdict"] in ("better", "worse", "no difference", "inconclusive") and row["acted"]["steps"] == 6
    assert row["difference"] == sum(row["per_seed"]) / 2
    assert "| otb | grpo | 2 |" in (out / "compare.md").read_text()
    assert "[4/4 " in first.stdout and "left]" in first.stdout  # the progress bar with the time left

    lines = (out / "runs.jsonl").read_text()
    again = _compare(*argv)
    assert again.returncode == 0 and "4 of 4 runs done" in again.stdout and "[1/" not in again.stdout
    assert (out / "runs.jsonl").read_text() == lines  # nothing trained, nothing appended
    assert json.loads((out / "compare.json").read_text())["comparisons"] == result["comparisons"]


OTHERS = [name for name in tested_methods() if name != BASELINE]


@pytest.mark.parametrize("methods", [OTHERS], ids=["-".join(OTHERS)])
def test_every_method_trains_through_compare(methods, tmp_path):
    """`compare --methods grpo,<every other method>`: each method's runs train through the train command, report
    whether its mechanism acted on each step, and are paired with the baseline's (one row per method)."""
    out = tmp_path / "cmp"
    argv = ["--methods", ",".join([BASELINE, *methods]), "--seeds", "2", "--max_steps", "2", "--eval_examples", "8",
            "--workers", "2", "--output_dir", str(out)]  # fmt: skip
    proc = _compare(*argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "compare.json").read_text())
    runs = [r for r in result["runs"] if "error" not in r]
    assert sorted((r["method"], r["seed"]) for r in runs) == sorted(
        (m, s) for m in [BASELINE, *methods] for s in (0, 1)
    )
    reports = {m: trl_groupopt.get_method(m).mechanism is not None for m in [BASELINE, *methods]}  # else no report
    assert all(r["steps"] == 2 and r["heldout_examples"] == 8 for r in runs)
    assert all(r["acted"]["steps"] == 2 if reports[r["method"]] else r["acted"] is None for r in runs)
    rows = {row["method"]: row for row in result["comparisons"]}
    assert sorted(rows) == sorted(methods)
    table = (out / "compare.md").read_text()
    for method, row in rows.items():
        assert (row["baseline"], row["n"]) == (BASELINE, 2), method
        assert row["acted"]["steps"] == 4 if reports[method] else row["acted"] is None, method
        assert f"| {method} | {BASELINE} | 2 |" in table, method


def test_python_twin_on_a_users_dataset_scores_the_carved_heldout_rows(tmp_path):
    data = tmp_path / "mine.jsonl"
    rows = [{"prompt": r["prompt"], "solution": r["solution"]} for r in make_arithmetic_dataset(80, split="train")]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = trl_groupopt.compare("grpo,otb", 2, tmp_path / "cmp", eval_examples=16, dataset_name=str(data),
                                  max_steps=2, save_strategy="no")  # fmt: skip
    runs = [r for r in result["runs"] if "error" not in r]
    assert len(runs) == 4 and all(r["heldout_examples"] == 16 for r in runs)
    assert len({r["accuracy_before"] for r in runs}) == 1 and all(0 <= r["accuracy_after"] <= 1 for r in runs)
    heldout = (tmp_path / "cmp" / "data" / "heldout.jsonl").read_text().splitlines()
    train = (tmp_path / "cmp" / "data" / "train.jsonl").read_text().splitlines()
    assert (len(heldout), len(train)) == (16, 64) and set(heldout).isdisjoint(train)
    assert result["comparisons"][0]["n"] == 2


def test_help_and_bad_input_answer_without_importing_trl():
    probe = ("import sys, trl_groupopt.comparison.driver as c\nassert c.main(['--methods', 'grpo', '--seeds', '2', "
             "'--output_dir', 'unused']) == 2\nprint(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'torch', 'trl', 'transformers', 'datasets', 'matplotlib'}))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr
    assert "name a method to compare with the baseline too" in proc.stderr
    assert "--eval_examples" in _compare("--help").stdout
