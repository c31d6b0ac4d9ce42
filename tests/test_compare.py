"""`trl-groupopt compare` without training: the paired statistics and the verdict rule against independent values,
bad input refused before the first run (one line naming the fix), the keyed runs file (resume, retry, other
settings refused, SIGTERM after the run in flight), the four files from fake runs, and the held-out carve of a
user's dataset. The real runs are in tests/e2e/test_compare.py."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest

from tests.selection import tested_methods
from trl_groupopt.comparison import driver as compare_module
from trl_groupopt.comparison import runs as runfile
from trl_groupopt.comparison import split, stats, trainrun
from trl_groupopt.comparison.driver import CompareError, Options, check, parse_options

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------ statistics
def test_t_interval_matches_student_t():
    scipy_stats = pytest.importorskip("scipy.stats")
    values = [0.31, 0.42, 0.38]
    result = stats.mean_ci(values + [None, float("nan")])  # missing seeds are ignored
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    assert result["n"] == 3 and result["mean"] == pytest.approx(mean) and result["std"] == pytest.approx(sd)
    assert result["ci95"] == pytest.approx(scipy_stats.t.ppf(0.975, 2) * sd / math.sqrt(3), rel=1e-3)
    assert result["low"] == pytest.approx(mean - result["ci95"]) and result["high"] == pytest.approx(
        mean + result["ci95"]
    )
    single = stats.mean_ci([0.5])
    assert single["mean"] == 0.5 and single["ci95"] is None and single["low"] is None
    assert stats.mean_ci([])["mean"] is None


def test_paired_differences_pair_by_seed():
    ours = {0: 0.5, 1: 0.25, 2: None, 3: 0.75}
    theirs = {3: 0.5, 0: 0.25, 1: 0.5, 2: 0.5, 9: 1.0}  # seed 9 has no pair; seed 2 has no value of ours
    assert stats.paired_differences(ours, theirs) == [0.25, -0.25, None, 0.25]


@pytest.mark.parametrize(
    ("diffs", "better", "margin", "expected"),
    [([0.10, 0.12, 0.08, 0.11, 0.09], +1, 0.02, "better"),
     ([-0.10, -0.12, -0.08, -0.11, -0.09], +1, 0.02, "worse"),
     ([-0.5, -0.4, -0.6], -1, None, "better"),  # lower is better: negative differences are better
     ([0.001, -0.002, 0.0, 0.002, -0.001], +1, 0.02, "no difference"),  # inside +-2 points
     ([0.001, -0.002, 0.0, 0.002, -0.001], +1, None, "inconclusive"),  # no band for a mechanism metric
     ([0.2, -0.2, 0.1, -0.1, 0.0], +1, 0.02, "inconclusive"),
     ([0.1], +1, 0.02, "inconclusive"),
     ([], +1, 0.02, "not run")],
)  # fmt: skip
def test_verdict_rule(diffs, better, margin, expected):
    assert stats.verdict(stats.mean_ci(diffs), better, margin) == expected


def test_floor_and_an_idle_mechanism_make_a_comparison_inconclusive():
    ours, theirs = {s: 0.3 + 0.01 * s for s in range(5)}, {s: 0.2 for s in range(5)}
    assert stats.compare_pair(ours, theirs)["verdict"] == "better"
    idle = {"what": "R was clipped", "steps": 10, "acted": 0}
    row = stats.compare_pair(ours, theirs, acted=idle)
    assert row["verdict"] == "inconclusive" and "does not test" in row["note"]
    assert stats.compare_pair(ours, theirs, acted={**idle, "acted": 3})["verdict"] == "better"
    floor = stats.compare_pair({s: 0.01 for s in range(5)}, {s: 0.0 + 0.002 * s for s in range(5)})
    assert floor["verdict"] == "inconclusive" and "floor" in floor["note"]


def test_power_note_is_the_fewest_seeds_for_one_point():
    for sd, target in ((0.05, 0.015), (0.02, 0.02), (0.1, 0.01), (0.001, 0.02)):
        n = stats.seeds_needed(sd, target)
        assert stats.half_width(sd, n) <= target and (n == 2 or stats.half_width(sd, n - 1) > target)
    assert stats.seeds_needed(0.001, 0.02, minimum=20) == 20
    note = stats.power_note(stats.mean_ci([0.05, -0.03, 0.04, -0.02]))
    # the note aims at half the margin, where "no difference" is within reach
    assert note["seeds_for_target"] == stats.seeds_needed(note["sd"], 0.01) and "+-1 point " in note["text"]
    assert stats.power_note(stats.mean_ci([0.1])) is None


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("argv", "fix"),
    [(["--methods", "grpo,nope", "--seeds", "2"], "unknown method 'nope'; choose from"),
     (["--methods", "grpo,otb", "--seeds", "1"], "--seeds 1: a paired interval needs at least 2 seeds"),
     (["--methods", "dfpo,otb", "--seeds", "3"], "--baseline grpo is not in --methods dfpo,otb: add it"),
     (["--methods", "grpo", "--seeds", "3"], "name a method to compare with the baseline too"),
     (["--methods", "grpo,otb", "--seeds", "2", "--seed", "4"], "--seed: compare sets these for each run"),
     (["--methods", "grpo,otb", "--seeds", "2", "--num_eval_examples", "9"], "use --eval_examples")],
)  # fmt: skip
def test_bad_input_stops_before_the_first_run_with_one_line(argv, fix, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trainrun, "run_one", lambda *a, **k: pytest.fail("a run started"))
    assert compare_module.main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trl-groupopt compare: error: ") and fix in err, err
    assert not (tmp_path / "out" / "runs.jsonl").exists()


def test_seed_is_not_read_as_an_abbreviation_of_seeds():
    assert parse_options(["--methods", "grpo,otb", "--seeds", "2", "--output_dir", "d", "--seed", "3"]).train_args == [
        "--seed",
        "3",
    ]


# ------------------------------------------------------------------------------------------------ fake runs
def _fake_runs(monkeypatch, calls: list, fail: set | None = None, sigterm_at: tuple | None = None) -> None:
    """Replace training: each (method, seed) 'trains' in no time, OTB 5 points ahead of GRPO on every seed."""

    def fake(spec, method, seed, env, before=None, track=None, device=None):
        calls.append((method, seed))
        if (method, seed) == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill -TERM` would, while this run trains
        if fail and (method, seed) in fail:
            fail.discard((method, seed))
            raise RuntimeError("exit status 1; log: ValueError: boom")
        after = 0.30 + 0.01 * seed + (0.05 if method == "otb" else 0.0)
        return {"method": method, "seed": seed, "accuracy_before": 0.18, "accuracy_after": after,
                "heldout_examples": 8, "steps": 3, "acted": {"what": "it acted", "steps": 3, "acted": 2},
                "wall_s": 1.0, "cpu_s": 0.5, "output_dir": "x"}  # fmt: skip

    monkeypatch.setattr(trainrun, "run_one", fake)


def test_four_files_resume_and_refuse_other_settings(tmp_path, monkeypatch):
    calls: list = []
    _fake_runs(monkeypatch, calls)
    out = tmp_path / "cmp"
    result = compare_module.compare("grpo,otb", 3, out, max_steps=3)
    assert sorted(calls) == [(m, s) for m in ("grpo", "otb") for s in range(3)]
    for name in ("runs.jsonl", "compare.json", "compare.md", "compare.png"):
        assert (out / name).is_file(), name
    assert (out / "compare.png").read_bytes()[:8] == PNG_MAGIC
    (row,) = json.loads((out / "compare.json").read_text())["comparisons"]
    assert row == result["comparisons"][0]
    assert (row["method"], row["baseline"], row["n"], row["verdict"]) == ("otb", "grpo", 3, "better")
    assert row["difference"] == pytest.approx(0.05) and row["ci95"] == pytest.approx([0.05, 0.05])
    assert row["acted"] == {
        "what": "it acted",
        "steps": 9,
        "acted": 6,
        "fraction": pytest.approx(2 / 3),
        "undefined": 0,
    }
    assert "| otb | grpo | 3 | +5.0 | [+5.0, +5.0] | **better** |" in (out / "compare.md").read_text()
    lines = (out / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 7 and json.loads(lines[-1])["invocation"]["runs"] == 6

    calls.clear()  # again, one more seed: only the new seed's runs train
    compare_module.compare(["grpo", "otb"], 4, out, max_steps=3)
    assert sorted(calls) == [("grpo", 3), ("otb", 3)] and (out / "runs.jsonl").read_text().startswith("\n".join(lines))
    calls.clear()
    with pytest.raises(CompareError, match=r"max_steps.*3.*5.*pass the train options"):
        compare_module.compare("grpo,otb", 4, out, max_steps=5)
    assert calls == []


@pytest.mark.parametrize("method", [name for name in tested_methods() if name != "grpo"])
def test_every_method_is_compared_with_the_baseline(method, tmp_path, monkeypatch):
    """Any registered method is accepted and gets its row against the default baseline (fake runs)."""
    calls: list = []
    _fake_runs(monkeypatch, calls)
    result = compare_module.compare(["grpo", method], 2, tmp_path / "cmp", max_steps=3)
    assert sorted(calls) == sorted((m, s) for m in ("grpo", method) for s in range(2))
    (row,) = result["comparisons"]
    assert (row["method"], row["baseline"], row["n"]) == (method, "grpo", 2)
    assert f"| {method} | grpo | 2 |" in (tmp_path / "cmp" / "compare.md").read_text()


def test_a_failed_run_stops_the_comparison_and_runs_again_next_time(tmp_path, monkeypatch, capsys):
    calls: list = []
    _fake_runs(monkeypatch, calls, fail={("otb", 0)})
    out = tmp_path / "cmp"
    argv = ["--methods", "grpo,otb", "--seeds", "2", "--output_dir", str(out), "--max_steps", "3"]
    assert compare_module.main(argv) == 1
    assert calls == [("grpo", 0), ("otb", 0)]  # nothing after the failure
    assert "boom" in (out / "runs.jsonl").read_text() and "Failed runs" in (out / "compare.md").read_text()
    calls.clear()
    assert compare_module.main(argv) == 0 and calls == [("otb", 0), ("grpo", 1), ("otb", 1)]


def test_sigterm_stops_after_the_run_in_flight(tmp_path, monkeypatch):
    calls: list = []
    _fake_runs(monkeypatch, calls, sigterm_at=("otb", 0))
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "cmp"
    assert compare_module.main(["--methods", "grpo,otb", "--seeds", "2", "--output_dir", str(out)]) == 143
    assert calls == [("grpo", 0), ("otb", 0)] and signal.getsignal(signal.SIGTERM) == before
    records = runfile.read_runs(out / "runs.jsonl", runfile.Grid(("method", "seed"), None, None))
    assert [(r["method"], r["seed"]) for r in records.records] == [("grpo", 0), ("otb", 0)]  # the run in flight kept
    assert records.invocations[0]["runs"] == 2


def test_runs_file_keeps_the_last_record_per_key(tmp_path):
    path = tmp_path / "runs.jsonl"
    grid = runfile.Grid(("method", "seed"), None, None)
    runfile.append_line(path, {"method": "a", "seed": 0, "error": "x", "settings": {"s": 1}})
    runfile.append_line(path, {"method": "a", "seed": 1, "v": float("nan"), "settings": {"s": 1}})
    runfile.append_line(path, {"method": "a", "seed": 0, "v": 2, "settings": {"s": 1}})
    runs = runfile.read_runs(path, grid)
    assert [(r["seed"], r.get("v")) for r in runs.records] == [(1, None), (0, 2)]  # NaN written as null
    assert runfile.pending(grid, runs, [("a", 0), ("a", 1), ("a", 2)]) == [("a", 2)]
    assert runfile.settings_conflict(grid, runs, {"s": 1}) is None
    assert "s 1 there, 2 here" in runfile.settings_conflict(grid, runs, {"s": 2})
    assert runfile.progress_line(2, 8, 60.0).endswith("1:00 elapsed, ~3:00 left]")


def test_check_accepts_a_valid_comparison():
    check(Options(["grpo", "otb", "dfpo"], 2, "out", train_args=["--max_steps", "3"]))


# ------------------------------------------------------------------------------------------------ a user's dataset
def test_heldout_rows_are_carved_once_and_left_out_of_training(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Compute {i}+1", "solution": str(i + 1)}) + "\n" for i in range(30))
    )
    options = Options(["grpo", "otb"], 2, str(tmp_path / "out"), eval_examples=8,
                      train_args=["--dataset_name", str(data), "--max_steps", "2"])  # fmt: skip
    args = split.carve_heldout(options, tmp_path / "out" / "data")
    train_file = str(tmp_path / "out" / "data" / "train.jsonl")
    # the runs train on the rest and hold no rows of their own out (compare scores them): --num_eval_examples 0
    assert args == (["--max_steps", "2", "--dataset_name", train_file, "--dataset_format", "prompt-answer",
                     "--num_eval_examples", "0"], True)  # fmt: skip

    def rows(name):
        return [json.loads(line) for line in (tmp_path / "out" / "data" / name).read_text().splitlines()]

    heldout, train = rows("heldout.jsonl"), rows("train.jsonl")
    assert len(heldout) == 8 and len(train) == 22
    assert {r["prompt"] for r in heldout}.isdisjoint(r["prompt"] for r in train)
    first = (tmp_path / "out" / "data" / "heldout.jsonl").read_text()
    split.carve_heldout(options, tmp_path / "again")  # the same rows, from a fixed seed
    assert (tmp_path / "again" / "heldout.jsonl").read_text() == first
    other = Options(["grpo", "otb"], 2, "o", eval_examples=5, train_args=["--model_name_or_path", str(tmp_path)])
    expected = ([*other.train_args, "--num_eval_examples", "0"], True)  # scored here, not by the runs
    assert split.carve_heldout(other, tmp_path / "synthetic") == expected
    assert len((tmp_path / "synthetic" / "heldout.jsonl").read_text().splitlines()) == 5  # the synthetic test split
    with pytest.raises(CompareError, match="leaving 0 to train on.*pass --eval_examples 15 or fewer"):
        split.carve_heldout(Options(["grpo", "otb"], 2, "o", eval_examples=30, train_args=[
            "--dataset_name", str(data)]), tmp_path / "small")  # fmt: skip


def test_each_run_goes_through_the_train_command():
    options = Options(["grpo", "otb"], 2, "DIR", train_args=["--max_steps", "3"])
    run_args, score_here = split.carve_heldout(options, Path("DIR") / "data")
    assert not score_here  # the embedded policy's runs score the synthetic test split themselves
    command = trainrun.RunSpec("DIR", tuple(run_args), score_here, 200).command("otb", 1)
    assert command[1:5] == ["-m", "trl_groupopt.cli", "train", "--method"]
    assert command[5:9] == ["otb", "--seed", "1", "--output_dir"] and Path(command[9]) == Path("DIR/runs/otb-1")
    assert command[-4:] == ["--max_steps", "3", "--num_eval_examples", "200"]  # the shared held-out split's size
    several = trainrun.RunSpec("DIR", tuple(run_args), score_here, 200, processes=2).command("otb", 1, port=29555)
    launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--main_process_port", "29555", "--module", "trl_groupopt.cli", "train", "--method", "otb"]  # fmt: skip
    assert several[1:15] == launch and several[-4:] == command[-4:]


def test_workers_run_several_at_once_with_the_same_result(tmp_path, monkeypatch):
    calls: list = []
    _fake_runs(monkeypatch, calls)
    one = compare_module.compare("grpo,otb,dfpo", 3, tmp_path / "one", max_steps=3)
    two = compare_module.compare("grpo,otb,dfpo", 3, tmp_path / "two", workers=2, max_steps=3)
    assert sorted(calls[:9]) == sorted(calls[9:]) and len(calls) == 18
    assert [c["verdict"] for c in one["comparisons"]] == [c["verdict"] for c in two["comparisons"]]
    assert two["settings"]["workers"] == 2 and len(two["runs"]) == 9
