"""`trl-groupopt compare` at scale, without training (issue 45): the device pool (`--devices`), `--seeds auto`
(Stein's two-stage rule, and a simulation of its coverage), secrets kept out of every file, the Slurm launcher's
bookkeeping (each result collected once, a job that ended without one reported and run again), and the bad input
refused before anything runs or is submitted. The real runs: tests/e2e/test_compare_scale.py; a real Slurm cluster:
tests/slurm/."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time

import pytest

from trl_groupopt.comparison import driver as compare_module
from trl_groupopt.comparison import local, seeds, slurm, slurm_job, stats, trainrun
from trl_groupopt.comparison import runs as runfile

TOKEN = "hf_PLANTEDsecretTOKEN0123456789"


def _fake_runs(monkeypatch, calls: list, *, sleep: float = 0.0, diff=lambda seed: 0.05, envs: list | None = None):
    """Replace training: each (method, seed) takes `sleep` s; a method is `diff(seed)` ahead of GRPO."""

    def fake(spec, method, seed, env, before=None, track=None, device=None):
        started = time.time()
        calls.append((method, seed))
        if envs is not None:
            envs.append(dict(env))
        time.sleep(sleep)
        after = 0.30 + 0.001 * seed + (diff(seed) if method != "grpo" else 0.0)
        devices = env.get("CUDA_VISIBLE_DEVICES")
        return {"method": method, "seed": seed, "accuracy_before": 0.18, "accuracy_after": after,
                "heldout_examples": 8, "steps": 3, "acted": {"what": "it acted", "steps": 3, "acted": 2},
                "wall_s": sleep, "cpu_s": 0.1, "output_dir": "x", "devices": devices.split(",") if devices else None,
                "start_time": started, "end_time": time.time()}  # fmt: skip

    monkeypatch.setattr(trainrun, "run_one", fake)


# ------------------------------------------------------------------------------------------------ several devices
@pytest.mark.parametrize(("devices", "per_run"), [("0,1", 1), ("0,1,2,3", 2)])
def test_devices_runs_overlap_on_distinct_devices_never_one_held_twice(tmp_path, monkeypatch, devices, per_run):
    calls, envs = [], []
    _fake_runs(monkeypatch, calls, sleep=0.4, envs=envs)
    result = compare_module.compare("grpo,otb", 3, tmp_path / "cmp", devices=devices, gpus_per_run=per_run)
    runs = result["runs"]
    assert len(runs) == 6 and all(len(r["devices"]) == per_run for r in runs)
    assert {d for r in runs for d in r["devices"]} == set(devices.split(","))
    overlapping = 0
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"]:  # at the same time
                overlapping += 1
                assert not set(a["devices"]) & set(b["devices"]), (a, b)  # never a device another holds
    assert overlapping >= 2  # two runs at once, three times over
    assert all(e["OMP_NUM_THREADS"] == "1" for e in envs)  # no CUDA here: the runs share the CPU
    launcher = json.loads((tmp_path / "cmp" / "launcher.json").read_text())
    assert launcher == {"launcher": "local", "gpus_per_run": 0}  # slots only: no CUDA here
    assert "Runs: on devices" in (tmp_path / "cmp" / "compare.md").read_text()


def test_device_sets_split_the_devices_and_never_share_one():
    def sets(devices, per_run, concurrency):
        return local.device_sets(local.Placement(tuple(devices), per_run, concurrency, False))

    assert sets(["a", "b", "c"], 2, 1) == [["a", "b"]]  # the third waits for no run: 3 // 2 sets
    assert sets(["0", "1", "2", "3"], 2, 2) == [["0", "1"], ["2", "3"]]
    assert local.device_sets(local.Placement((), 1, 3, True)) == [None, None, None]  # the CPU, --workers 3


# ------------------------------------------------------------------------------------------------ --seeds auto
def test_stein_total_is_the_fewest_seeds_with_the_pilots_interval_inside_the_target():
    for sd, n0 in ((0.04, 8), (0.02, 8), (0.01, 3), (0.0, 5), (0.1, 2)):
        n = stats.stein_total(sd, n0, 0.02)
        t = stats.t_quantile(n0 - 1)
        assert n >= n0 and t * sd / math.sqrt(n) <= 0.02
        assert n == n0 or t * sd / math.sqrt(n - 1) > 0.02
    ci = stats.stein_ci([0.01, 0.03, None, 0.02], pilot_sd=0.05, pilot_n=2)
    assert ci["n"] == 3 and ci["ci95"] == pytest.approx(12.706 * 0.05 / math.sqrt(3), rel=1e-4)
    assert ci["low"] == pytest.approx(0.02 - ci["ci95"]) and ci["std"] == pytest.approx(0.01)


def test_stein_interval_covers_the_true_difference_95_percent_of_the_time():
    """20,000 simulated `--seeds auto` comparisons through the driver's own code (`seeds.plan`, then
    `stats.compare_pair` with the pilot): paired differences drawn from N(0.013, 0.045^2), a pilot of 8 seeds."""
    rng, mu, sigma, pilot, trials = random.Random(45), 0.013, 0.045, 8, 20_000
    covered, totals = 0, []
    for _ in range(trials):
        draw = [rng.gauss(mu, sigma) for _ in range(seeds.MAX_SEEDS)]
        base = [rng.uniform(0.2, 0.4) for _ in range(seeds.MAX_SEEDS)]  # the baseline's accuracy, cancels in d
        records = [{"method": m, "seed": s, "accuracy_after": base[s] + (draw[s] if m == "otb" else 0.0)}
                   for s in range(seeds.MAX_SEEDS) for m in ("grpo", "otb")]  # fmt: skip
        plan = seeds.plan([r for r in records if r["seed"] < pilot], ["grpo", "otb"], "grpo", pilot, 1000)
        n = plan["total"]
        row = plan["methods"]["otb"]
        ours = {r["seed"]: r["accuracy_after"] for r in records if r["method"] == "otb" and r["seed"] < n}
        theirs = {r["seed"]: r["accuracy_after"] for r in records if r["method"] == "grpo" and r["seed"] < n}
        if n > seeds.MAX_SEEDS:  # rare: draw the rest
            extra = [rng.gauss(mu, sigma) for _ in range(n - seeds.MAX_SEEDS)]
            ours.update({seeds.MAX_SEEDS + i: 0.3 + d for i, d in enumerate(extra)})
            theirs.update({seeds.MAX_SEEDS + i: 0.3 for i in range(len(extra))})
        # Stein's t interval alone (resamples 0): the bootstrap-t widening only widens it
        d = stats.compare_pair(ours, theirs, pilot=(row["pilot_n"], row["planned_sd"]), resamples=0)["difference"]
        assert d["ci95"] <= stats.PLAN_HALF_WIDTH + 1e-12 and d["n"] == n
        covered += d["low"] <= mu <= d["high"]
        totals.append(n)
    coverage, se = covered / trials, math.sqrt(0.95 * 0.05 / trials)
    assert abs(coverage - 0.95) < 3 * se, (coverage, se)  # 0.95 +- 0.0046
    # the planned total follows the pilot: about (t(0.975, 7) * sigma / 0.01)^2 = 113 seeds on average
    assert 95 < sum(totals) / trials < 135 and min(totals) >= pilot
    print(
        f"Stein coverage {coverage:.4f} over {trials} comparisons (SE {se:.4f}); mean total {sum(totals) / trials:.1f}"
    )


def test_seeds_auto_runs_the_pilot_then_the_planned_total_and_stops(tmp_path, monkeypatch):
    calls: list = []
    _fake_runs(monkeypatch, calls, diff=lambda seed: 0.05 + (0.01 if seed % 2 else -0.01))
    out = tmp_path / "cmp"
    result = compare_module.compare("grpo,otb", "auto", out, pilot_seeds=4, max_seeds=40)
    plan = result["seed_plan"]
    diffs = [0.05 + (0.01 if s % 2 else -0.01) for s in range(4)]
    sd = stats.mean_ci(diffs)["std"]
    expected = max(4, math.ceil((3.1824 * sd / 0.01) ** 2))  # t(0.975, 3) = 3.1824; +-1 point: half the margin
    assert plan["total"] == expected and plan["methods"]["otb"]["pilot_sd"] == pytest.approx(sd) and not plan["capped"]
    assert calls[:8] == seeds.keys(["grpo", "otb"], 4) and sorted(calls) == sorted(
        seeds.keys(["grpo", "otb"], expected)
    )
    (row,) = result["comparisons"]
    assert row["n"] == expected and row["interval"] == "stein"
    stein_half = stats.t_quantile(3) * sd / math.sqrt(expected)
    assert row["ci95"][1] - row["difference"] >= stein_half - 1e-12 and row["procedure"] in ("stein", "bootstrap-t")
    assert row["procedure"] == "bootstrap-t" or row["ci95"][1] - row["difference"] == pytest.approx(stein_half)
    text = (out / "compare.md").read_text()
    assert "Stein's two-stage rule" in text and f"planned total **{expected} seeds**" in text
    assert f"otb {100 * sd:.1f} points over 4 seeds" in text
    calls.clear()
    assert compare_module.main(["--methods", "grpo,otb", "--seeds", "auto", "--pilot_seeds", "4",
                                "--output_dir", str(out)]) == 0 and calls == []  # fmt: skip


def test_seeds_auto_caps_at_max_seeds(tmp_path, monkeypatch):
    _fake_runs(monkeypatch, [], diff=lambda seed: 0.2 * (-1) ** seed)
    result = compare_module.compare("grpo,otb", "auto", tmp_path / "cmp", pilot_seeds=3, max_seeds=5)
    assert result["seed_plan"]["capped"] and result["seed_plan"]["total"] == 5 and len(result["runs"]) == 10
    assert "capped at --max_seeds 5" in (tmp_path / "cmp" / "compare.md").read_text()


# ------------------------------------------------------------------------------------------------ secrets
def test_a_hub_token_reaches_the_runs_environment_and_no_file(tmp_path, monkeypatch):
    calls, envs = [], []
    _fake_runs(monkeypatch, calls, envs=envs)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "cmp"
    argv = [
        "--methods",
        "grpo,otb",
        "--seeds",
        "2",
        "--output_dir",
        str(out),
        "--hub_token",
        TOKEN,
        "--max_steps",
        "2",
    ]
    assert compare_module.main(argv) == 0
    assert all(e["HF_TOKEN"] == TOKEN for e in envs) and len(envs) == 4
    for path in out.rglob("*"):
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path
    result = json.loads((out / "compare.json").read_text())
    assert result["settings"]["train_args"] == ["--max_steps", "2"] and "--hub_token" not in result["command"]


# ------------------------------------------------------------------------------------------------ Slurm bookkeeping
def _launcher(tmp_path) -> slurm.SlurmLauncher:
    spec = trainrun.RunSpec(str(tmp_path), (), False, 8)
    return slurm.SlurmLauncher(spec, slurm.SlurmOptions(time="10"), {}, {"train_args": []}, "cmd")


def _result(method, seed, job_id, accuracy):
    return {"method": method, "seed": seed, "accuracy_before": 0.1, "accuracy_after": accuracy, "wall_s": 1.0,
            "cpu_s": 1.0, "slurm_job_id": job_id}  # fmt: skip


def _job(launcher, method, seed, job_id):
    entry = {"method": method, "seed": seed, "job_id": job_id, "stderr": f"/logs/{job_id}_0_log.err"}
    runfile.append_line(launcher.jobs_path, entry)


def test_slurm_results_are_collected_once_and_a_job_ended_without_one_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "RESULT_GRACE_S", 0.0)
    launcher, keys = _launcher(tmp_path), [("grpo", 0), ("otb", 0), ("grpo", 1)]
    for key, job_id in zip(keys, ("7_0", "7_1", "7_2")):
        _job(launcher, *key, job_id)
    slurm_job.write_result(tmp_path, "7_0", _result("grpo", 0, "7_0", 0.3))
    keys.append(("otb", 1))
    _job(launcher, "otb", 1, "7_3")
    slurm_job.write_result(tmp_path, "7_3", {"method": "otb", "seed": 1, "error": "boom", "slurm_job_id": "7_3"})
    states = {"7_0": "COMPLETED", "7_1": "RUNNING", "7_2": "CANCELLED", "7_3": "COMPLETED"}
    new, live = launcher.collect(keys, states)
    assert [r.get("slurm_job_id") for r in new] == ["7_0", "7_2", "7_3"] and live == {("otb", 0)}
    assert "ended as CANCELLED without a result" in new[1]["error"] and new[1]["log"] == "/logs/7_2_0_log.err"
    again, live = launcher.collect(keys, states)  # nothing is counted twice
    assert again == [] and live == {("otb", 0)}
    _job(launcher, "grpo", 1, "8")  # the next invocation's job for the lost run
    slurm_job.write_result(tmp_path, "8", _result("grpo", 1, "8", 0.2))
    new, _ = launcher.collect(keys, {"7_1": "RUNNING"})  # "8" not in squeue: its result file says it finished
    assert [r["slurm_job_id"] for r in new] == ["8"]
    records = runfile.read_runs(tmp_path / "runs.jsonl", launcher.grid).records
    assert [(r["method"], r["seed"], "error" in r) for r in records] == [("grpo", 0, False), ("otb", 1, True),
                                                                          ("grpo", 1, False)]  # fmt: skip
    assert runfile.pending(launcher.grid, runfile.read_runs(tmp_path / "runs.jsonl", launcher.grid), keys) == [
        ("otb", 0), ("otb", 1)]  # fmt: skip


def test_a_job_writes_its_record_or_an_error_and_nothing_when_slurm_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    spec = trainrun.RunSpec(str(tmp_path), (), False, 8)

    def failing(*args, **kwargs):
        raise RuntimeError("exit status 1; log: ValueError: boom")

    monkeypatch.setattr(trainrun, "run_one", failing)
    record = slurm_job.run_job(spec, "otb", 1, {"train_args": []})
    written = json.loads((tmp_path / "slurm" / "results" / "12_3.json").read_text())
    assert written == record and "boom" in record["error"] and record["slurm_job_id"] == "12_3"
    assert record["log"] == str(tmp_path / "runs" / "otb-1.log")

    def cancelled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as scancel would, while the run trains
        raise RuntimeError("exit status -15")

    monkeypatch.setattr(trainrun, "run_one", cancelled)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit):  # the job ends without a result: squeue tells the driver
        slurm_job.run_job(spec, "otb", 2, {"train_args": []})
    assert not (tmp_path / "slurm" / "results" / "12_4.json").exists() and signal.getsignal(signal.SIGTERM) == before


def test_a_job_ended_without_a_result_is_given_the_grace_first(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "RESULT_GRACE_S", 3600.0)
    launcher = _launcher(tmp_path)
    _job(launcher, "grpo", 0, "9")
    assert launcher.collect([("grpo", 0)], {}) == ([], {("grpo", 0)})  # may still show its result file


def test_slurm_time_limits_and_job_names():
    assert [slurm.minutes(x) for x in ("90", "1:30:00", "2-00:00:00", "5:30", "1-12", "0", "soon")] == [
        90, 90, 2880, 6, 2160, None, None]  # fmt: skip
    assert slurm.job_name("/a/b") == slurm.job_name("/a/b/../b") != slurm.job_name("/a/c")


# ------------------------------------------------------------------------------------------------ bad input
def _slurm_here(monkeypatch, partitions=None):
    """A cluster as sinfo would describe it, without one: only for the checks (tests/slurm/ has the real one)."""
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    known = partitions if partitions is not None else {"debug": {"default": True, "gpus": 0}}
    monkeypatch.setattr(slurm, "partitions", lambda: known)


SLURM = ["--launcher", "slurm", "--slurm_time", "10", "--slurm_gpus_per_run", "0"]


@pytest.mark.parametrize(
    ("argv", "setup", "fix"),
    [(["--seeds", "auto", "--max_seeds", "5"], None, "--max_seeds 5 is below the pilot of 8 seeds: raise"),
     (["--seeds", "auto", "--pilot_seeds", "1"], None, "--pilot_seeds 1: a pilot needs at least 2 seeds"),
     (["--seeds", "many"], None, "--seeds many: a paired interval needs at least 2 seeds"),
     (["--gpus_per_run", "2"], None, "--gpus_per_run 2: no GPU here"),
     (["--devices", "0,1", "--gpus_per_run", "3"], None, "--gpus_per_run 3: only 2 device(s) here (0,1)"),
     (["--devices", "0,0"], None, "names a device twice"),
     (["--devices", "0,1", "--workers", "2"], None, "--workers 2 is the concurrency on the CPU"),
     (["--slurm_partition", "gpu"], None, "--slurm_partition: these are for --launcher slurm"),
     (SLURM, "no-submitit", 'needs submitit, which is not installed: pip install "trl-groupopt[slurm]"'),
     (SLURM, "no-sbatch", "sbatch, squeue, sinfo, scancel not on the PATH"),
     ([*SLURM, "--slurm_partition", "gpu"], "cluster", "--slurm_partition gpu: sinfo knows debug; pass"),
     (["--launcher", "slurm", "--slurm_time", "10"], "cluster", "--slurm_gpus_per_run 1: partition debug has nodes "
      "of at most 0 GPU(s); pass --slurm_gpus_per_run 0"),
     (["--launcher", "slurm"], "cluster", "--slurm_time: give each job's time limit"),
     ([*SLURM, "--slurm_mem", "lots"], "cluster", "--slurm_mem lots: give a size Slurm reads"),
     ([*SLURM, "--devices", "0"], "cluster", "--devices: with --launcher slurm each job gets what")],
)  # fmt: skip
def test_bad_input_is_refused_before_anything_runs_or_is_submitted(argv, setup, fix, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trainrun, "run_one", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(slurm.SlurmLauncher, "submit", lambda *a: pytest.fail("a job was submitted"))
    if setup == "no-submitit":
        monkeypatch.setitem(sys.modules, "submitit", None)
    elif setup == "no-sbatch":
        monkeypatch.setenv("PATH", str(tmp_path))
    elif setup == "cluster":
        _slurm_here(monkeypatch)
    seeds_given = [] if "--seeds" in argv else ["--seeds", "2"]
    code = compare_module.main(["--methods", "grpo,otb", *seeds_given, "--output_dir", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("trl-groupopt compare: error: ") and fix in err, err
    assert not (tmp_path / "out").exists()


def test_a_folder_run_with_another_launcher_or_gpus_per_run_is_refused(tmp_path, monkeypatch, capsys):
    _fake_runs(monkeypatch, [])
    out = str(tmp_path / "cmp")
    compare_module.compare("grpo,otb", 2, out, devices="0,1")
    _slurm_here(monkeypatch, {"gpu": {"default": True, "gpus": 4}})
    monkeypatch.setattr(slurm.SlurmLauncher, "submit", lambda *a: pytest.fail("a job was submitted"))
    lines = (tmp_path / "cmp" / "runs.jsonl").read_text()
    argv = ["--methods", "grpo,otb", "--seeds", "3", "--output_dir", out, "--launcher", "slurm", "--slurm_time", "9"]
    assert compare_module.main(argv) == 2
    assert "launcher 'local' there, 'slurm' here" in capsys.readouterr().err
    (tmp_path / "cmp" / "launcher.json").write_text(json.dumps({"launcher": "slurm", "gpus_per_run": 1}))
    assert compare_module.main([*argv, "--slurm_gpus_per_run", "2"]) == 2
    assert "gpus_per_run 1 there, 2 here" in capsys.readouterr().err
    assert (tmp_path / "cmp" / "runs.jsonl").read_text() == lines


def test_cancel_needs_a_slurm_comparison(tmp_path, capsys):
    assert compare_module.main(["--output_dir", str(tmp_path), "--cancel"]) == 2
    assert "has no Slurm jobs" in capsys.readouterr().err


def test_the_python_twin_takes_every_option_by_name(tmp_path, monkeypatch):
    options = compare_module.parse_options(["--methods", "grpo,otb", "--seeds", "auto", "--output_dir", "d",
                                            "--slurm_setup", "module load cuda", "--slurm_setup", "echo hi"])  # fmt: skip
    assert options.seeds == "auto" and options.slurm.setup == ["module load cuda", "echo hi"]
    seen = []
    monkeypatch.setattr(compare_module, "run", seen.append)
    compare_module.compare(["grpo", "otb"], 3, tmp_path, devices=[0, 1], gpus_per_run=2, max_steps=4, bf16=False,
                           slurm_setup=["a", "b"])  # fmt: skip
    (made,) = seen
    assert (made.devices, made.gpus_per_run, made.seeds, made.slurm.setup) == (["0", "1"], 2, 3, ["a", "b"])
    assert made.train_args == ["--max_steps", "4", "--bf16", "false"]
