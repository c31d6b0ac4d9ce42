"""`trl-groupopt compare --launcher slurm` on a real Slurm cluster (issue 45), the embedded policy's 1-step runs as jobs:
they appear in `squeue` and their results come back; a job killed with `scancel` mid-run is reported with its log and
runs again on the next invocation; a driver stopped with SIGTERM leaves its jobs running and the same command
re-attaches (submitting nothing twice); `--cancel` cancels them; no secret reaches a file. No mock of Slurm or
submitit: CI's Slurm stage runs these inside `bash scripts/slurm_local.sh` (docs/compare.md, "On a Slurm cluster")."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trl_groupopt.comparison.slurm import job_name

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_PLANTEDslurmSECRET0123456789"
# 1-step runs on 8 held-out prompts, one CPU and 2 GB each: two at once on a 2-core, 24 GB machine
JOB = ["--launcher", "slurm", "--slurm_time", "10", "--slurm_gpus_per_run", "0", "--slurm_cpus_per_run", "1",
       "--slurm_mem", "2G", "--max_steps", "1", "--eval_examples", "8", "--save_strategy", "no"]  # fmt: skip


def _argv(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trl_groupopt.cli", "compare", "--methods", "grpo,otb", "--seeds", "2",
            "--output_dir", str(out), *JOB, *extra]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    return {**env, "PYTHONPATH": str(REPO)}


@contextmanager
def _driver(out: Path, *extra: str) -> Iterator[subprocess.Popen]:
    """The driver in the background (its output in DIR.driver.log); killed, and the comparison's jobs cancelled, if
    the test leaves it running."""
    log = out.with_suffix(".driver.log")
    with log.open("a") as handle:
        proc = subprocess.Popen(_argv(out, *extra), cwd=REPO, env=_env(), stdout=handle, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["scancel", "--name", job_name(out)], check=False, timeout=60)


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(out, *extra), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)


def _queue(out: Path) -> dict[str, str]:
    proc = subprocess.run(["squeue", "-h", "-r", "--name", job_name(out), "-o", "%i|%T"], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return dict(line.split("|", 1) for line in proc.stdout.split())


def _jobs(out: Path) -> list[dict]:
    path = out / "slurm" / "jobs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _wait(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"waited {seconds} s for {what}")


def _finished_once(out: Path) -> dict[tuple, dict]:
    """Each key's finished record, asserting none was written twice."""
    finished = [r for r in _lines(out) if "invocation" not in r and "error" not in r]
    keys = [(r["method"], r["seed"]) for r in finished]
    assert len(keys) == len(set(keys)), keys
    return dict(zip(keys, finished))


def test_a_comparison_goes_through_slurm_and_no_secret_reaches_a_file(tmp_path):
    out = tmp_path / "cmp"
    wrong = _run(out, "--slurm_partition", "nope")
    assert wrong.returncode == 2 and "--slurm_partition nope: sinfo knows debug" in wrong.stderr
    assert not out.exists()  # refused before anything was written or submitted
    refused = _run(tmp_path / "big", "--slurm_mem", "900G")  # more than the node has: sbatch refuses
    assert refused.returncode == 1 and "error: sbatch refused the jobs (" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "big" / "slurm" / "jobs.jsonl").exists() and not _queue(tmp_path / "big")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    setup = 'echo "token sha256 $(printf %s "$HF_TOKEN" | sha256sum | cut -c1-64)"'  # proves it arrived, unwritten
    seen: dict[str, str] = {}
    with _driver(out, "--hub_token", TOKEN, "--slurm_setup", setup) as proc:
        while proc.poll() is None:
            seen.update(_queue(out))
            time.sleep(0.5)
    assert proc.returncode == 0, out.with_suffix(".driver.log").read_text()[-3000:]
    jobs = _jobs(out)
    ids = [j["job_id"] for j in jobs]
    assert len(ids) == 4 and set(ids) <= set(seen) and len({i.split("_")[0] for i in ids}) == 1  # one array
    finished = _finished_once(out)
    assert sorted(finished) == [("grpo", 0), ("grpo", 1), ("otb", 0), ("otb", 1)]
    for job in jobs:
        record = finished[(job["method"], job["seed"])]
        assert record["slurm_job_id"] == job["job_id"] and record["steps"] == 1 and 0 <= record["accuracy_after"] <= 1
        assert f"token sha256 {digest}" in Path(job["stdout"]).read_text()  # HF_TOKEN reached the job's environment
    for path in [*out.rglob("*"), out.with_suffix(".driver.log")]:
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path
    result = json.loads((out / "compare.json").read_text())
    assert result["comparisons"][0]["n"] == 2 and result["launcher"] == {"launcher": "slurm", "gpus_per_run": 0}
    assert "one Slurm job each" in (out / "compare.md").read_text()


def test_a_job_cancelled_mid_run_is_reported_and_runs_again_next_time(tmp_path):
    out = tmp_path / "cmp"
    with _driver(out) as proc:
        # a job whose training has started: its run log exists
        def running() -> dict | None:
            queue = _queue(out)
            return next((j for j in _jobs(out) if queue.get(j["job_id"]) == "RUNNING"
                         and (out / "runs" / f"{j['method']}-{j['seed']}.log").exists()), None)  # fmt: skip

        victim = _wait(running, 180, "a running job")
        subprocess.run(["scancel", victim["job_id"]], check=True, timeout=60)
        proc.wait(timeout=300)
    log = out.with_suffix(".driver.log").read_text()
    assert proc.returncode == 1, log[-3000:]
    assert f"(job {victim['job_id']}): FAILED, runs again next time" in log and victim["stderr"] in log
    (lost,) = [r for r in _lines(out) if "error" in r]
    assert (lost["method"], lost["seed"], lost["log"]) == (victim["method"], victim["seed"], victim["stderr"])
    assert "ended as CANCELLED without a result" in lost["error"]
    assert len(_finished_once(out)) == 3

    again = _run(out)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "0 job(s) of this comparison live (re-attached), 1 to submit" in again.stdout
    jobs = _jobs(out)
    assert len(jobs) == 5 and (jobs[-1]["method"], jobs[-1]["seed"]) == (victim["method"], victim["seed"])
    finished = _finished_once(out)
    assert len(finished) == 4 and finished[(victim["method"], victim["seed"])]["slurm_job_id"] == jobs[-1]["job_id"]


def test_a_driver_stopped_by_sigterm_leaves_its_jobs_running_and_the_same_command_re_attaches(tmp_path):
    out = tmp_path / "cmp"
    with _driver(out) as proc:
        _wait(lambda: len(_jobs(out)) == 4, 120, "the 4 jobs submitted")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        live = _queue(out)
        assert all(live.get(j["job_id"]) in ("PENDING", "RUNNING") for j in _jobs(out)), live  # still running
        again = _run(out)
    assert "job(s) left running; run the same command again to re-attach" in out.with_suffix(".driver.log").read_text()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "0 to submit" in again.stdout and len(_jobs(out)) == 4  # re-attached: nothing submitted twice
    finished = _finished_once(out)
    assert sorted(r["slurm_job_id"] for r in finished.values()) == sorted(j["job_id"] for j in _jobs(out))


def test_cancel_cancels_the_comparisons_jobs(tmp_path):
    out = tmp_path / "cmp"
    with _driver(out) as proc:
        _wait(lambda: len(_jobs(out)) == 4, 120, "the 4 jobs submitted")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        cancelled = _run(out, "--cancel")
        assert cancelled.returncode == 0 and "cancelled 4 job(s)" in cancelled.stdout, cancelled.stdout
        _wait(lambda: not any(s in ("PENDING", "RUNNING") for s in _queue(out).values()), 60, "the jobs to end")


def test_jobs_slurm_will_never_start_are_said_with_the_option_to_fix(tmp_path):
    """Issue 52: `--slurm_cpus_per_run 999` on nodes of a few CPUs is accepted by sbatch and pends forever; the
    driver says so (squeue's reason, the option, the nodes' size) instead of waiting in silence."""
    out = tmp_path / "cmp"
    log = out.with_suffix(".driver.log")
    with _driver(out, "--slurm_cpus_per_run", "999"):  # the last one given wins
        _wait(lambda: log.exists() and "will not start" in log.read_text(), 180, "the driver to say why")
    said = next(line for line in log.read_text().splitlines() if "will not start" in line)
    assert "--slurm_cpus_per_run 999 CPUs, its partition's nodes have at most" in said and "--cancel" in said, said
    assert said.count("will not start") == 1 and log.read_text().count("will not start") == 1  # said once
