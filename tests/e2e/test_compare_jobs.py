"""Every run of `trl-groupopt compare` is a job of its own (issue 49, "One way to run a run"): two runs at once on a
user's `.jsonl` file, with `--devices 0,1` and with `--workers 2`, are all trained and scored, while the driver
loads no model; a job stops its run when its driver is killed hard; a run waits for its folder's lock and signals
no process a leftover pid file names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trl_groupopt.comparison import trainrun
from trl_groupopt.data.offline import make_arithmetic_dataset

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

#: the driver, in this process: every model it loads (none: every run loads its models in its own job). The driver
#: may import TRL (compare reads the train options with every method's train parser before anything runs); what the
#: issue forbids is a model in the driver, so `PreTrainedModel.from_pretrained`, which every Auto class ends in, records
#: each call.
PROBE = """import json, sys
from transformers import modeling_utils
loads, load = [], modeling_utils.PreTrainedModel.from_pretrained.__func__
def recorded(cls, *args, **kwargs):
    loads.append(cls.__name__)
    return load(cls, *args, **kwargs)
modeling_utils.PreTrainedModel.from_pretrained = classmethod(recorded)
from trl_groupopt.comparison import driver
status = driver.main(sys.argv[1:])
print("PROBE " + json.dumps({"status": status, "model_loads": loads}))
"""


def _user_file(path: Path, rows: int) -> Path:
    """A user's prompt-answer file: plain-string prompts of the task the embedded policy was trained on."""
    data = make_arithmetic_dataset(rows, seed=3, split="train")
    path.write_text("".join(json.dumps({"prompt": row["prompt"][0]["content"], "solution": row["solution"]}) + "\n"
                            for row in data))  # fmt: skip
    return path


@pytest.mark.parametrize("concurrency", [["--devices", "0,1"], ["--workers", "2"]], ids=["devices", "workers"])
def test_two_runs_at_once_on_a_users_jsonl_are_all_scored_and_the_driver_loads_no_model(tmp_path, concurrency):
    data, out = _user_file(tmp_path / "sum4.jsonl", 40), tmp_path / "cmp"
    argv = ["--methods", "grpo,otb", "--seeds", "2", *concurrency, "--dataset_name", str(data), "--max_steps", "2",
            "--eval_examples", "8", "--save_strategy", "no", "--output_dir", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=ENV)  # fmt: skip
    said = proc.stdout + proc.stderr
    probe = json.loads(said.split("PROBE ")[1].splitlines()[0])
    assert probe == {"status": 0, "model_loads": []}, said[-3000:]
    assert "FAILED" not in said
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in records if "invocation" not in r]
    assert sorted((r["method"], r["seed"]) for r in runs) == [(m, s) for m in ("grpo", "otb") for s in (0, 1)]
    for run in runs:  # every run scored on the held-out rows compare carved, in its own job
        assert isinstance(run["accuracy_before"], float) and isinstance(run["accuracy_after"], float), run
    spans = sorted((r["start_time"], r["end_time"]) for r in runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans  # two runs trained at once
    if concurrency[0] == "--devices":
        assert sorted(tuple(r["devices"]) for r in runs) == [("0",), ("0",), ("1",), ("1",)]
    base = json.loads((out / "data" / trainrun.BASE_ACCURACY).read_text())
    assert all(r["accuracy_before"] == base["accuracy"] for r in runs)  # the starting model scored once


JOB = """import os, sys, time
from pathlib import Path
from trl_groupopt.comparison import process
child = 'import os, time; open(os.environ["MARK"], "w").write(str(os.getpid())); time.sleep(120)'
with process.job_guard((int(sys.argv[1]), float(sys.argv[2]))):
    process.launch([sys.executable, '-c', child], Path(sys.argv[3]), os.environ)
"""
DRIVER = """import subprocess, sys, time, psutil
me = psutil.Process()
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(me.pid), repr(me.create_time()), sys.argv[2]])
time.sleep(300)
"""


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_job_stops_its_run_when_its_driver_is_killed_hard(tmp_path):
    mark = tmp_path / "child.pid"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, JOB, str(tmp_path / "run.log")],
                              env={**ENV, "MARK": str(mark)})  # fmt: skip
    try:
        assert _wait_for(lambda: mark.exists() and mark.read_text(), 60), "the run did not start"
        child = int(mark.read_text())
        driver.kill()  # SIGKILL: the driver runs no code of its own
        driver.wait()
        assert _wait_for(lambda: _gone(child), 15), "the run outlived its driver"
    finally:
        driver.kill()
        if mark.exists() and mark.read_text() and not _gone(int(mark.read_text())):
            os.kill(int(mark.read_text()), signal.SIGKILL)


def test_a_run_waits_for_its_folders_lock_and_signals_no_process_a_pid_file_names(tmp_path, monkeypatch):
    """A job of an earlier invocation still holding the run's folder is waited for; a pid file left in DIR/runs
    (an older version's, or anyone's) names a process that is never signalled, even one that leads its group."""
    spec = trainrun.RunSpec(str(tmp_path), (), False, 8)
    folder = spec.folder("otb", 0)
    folder.parent.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    folder.with_suffix(".pid").write_text(json.dumps({"pid": other.pid, "host": os.uname().nodename}))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, filelock\n"
                               "with filelock.FileLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(3)",
                               str(folder.with_suffix(".lock"))], stdout=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    launched, asked = [], time.monotonic()

    def fake_launch(command, log, env, *rest):
        launched.append(time.monotonic() - asked > 2.0)  # the holder had let go (after its 3 s) by now
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({"steps": 1}))
        return 1.0, 1.0

    monkeypatch.setattr(trainrun, "launch", fake_launch)
    try:
        record = trainrun.run_one(spec, "otb", 0, {})
        assert other.poll() is None  # never signalled
        assert launched == [True] and record["steps"] == 1
    finally:
        other.kill()
        holder.kill()
