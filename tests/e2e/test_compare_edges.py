"""`trl-groupopt compare` at its edges with real processes (issue 46): a failed run's reason is its error line, whole
(not the progress bar, not its tail; a full disk named), and on the embedded policy: a SIGKILLed comparison leaves
nothing training and resumes, Ctrl-C says in one line what was kept and how to resume, and an abbreviated hub token
reaches no file. Without processes: tests/test_compare_edges.py; the jobs themselves: tests/e2e/test_compare_jobs.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_groupopt.comparison import trainrun

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_PLANTEDe2eEDGEtoken0123456789"
TINY = ["--methods", "grpo,otb", "--seeds", "2", "--max_steps", "1", "--eval_examples", "8", "--save_strategy", "no"]


def _fail(tmp_path, script: str) -> str:
    with pytest.raises(RuntimeError) as info:
        trainrun.launch([sys.executable, "-c", script], tmp_path / "run.log", os.environ)
    return str(info.value)


def test_a_failed_runs_reason_is_its_error_line_not_the_progress_bar(tmp_path):
    bar = "sys.stderr.write(' 33%|###3      | 1/3 [00:01<00:02,  1.00s/it]\\r'); "
    message = _fail(tmp_path, f"import sys; print('step 1'); print('ValueError: boom', flush=True); {bar}sys.exit(1)")
    assert message.startswith("exit status 1; ") and message.endswith(": ValueError: boom"), message
    message = _fail(tmp_path, "import sys; print('trl-groupopt train: error: --beta -1: must be >= 0'); sys.exit(2)")
    assert message.endswith("error: --beta -1: must be >= 0")
    long = "Training diverged at step 2: the loss is nan. " + "Likely causes: a learning rate too high; " * 12
    message = _fail(tmp_path, f"import sys; print('trl-groupopt train: error: ' + {long!r}); {bar}sys.exit(1)")
    assert message.endswith(f"error: {long.strip()}"), message  # whole, its head included
    full = "OSError: [Errno 28] No space left on device: 'model.safetensors'"
    message = _fail(tmp_path, f"import sys; print({full!r}); {bar}sys.exit(1)")
    assert "the disk is full (No space left on device): free space under" in message, message


# ------------------------------------------------------------------------------------------------ real comparisons
def _start(out: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "trl_groupopt.cli", "compare", *TINY, "--output_dir", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**env, "PYTHONPATH": str(REPO)})  # fmt: skip


def _wait_for(condition, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _training(out: Path) -> list[str]:
    """The processes whose command line names the comparison folder (its runs), zombies left out."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(str(out).encode() in w for w in words):
            found.append(cmdline.parent.name)
    return found


def _records(out: Path) -> list[tuple]:
    lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    return sorted((r["method"], r["seed"]) for r in lines if "invocation" not in r and "error" not in r)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_comparison_killed_hard_leaves_nothing_training_and_resumes(tmp_path):
    out = tmp_path / "cmp"
    driver = _start(out, "--max_steps", "100")  # ~1 s a step: the run cannot end by itself while the test waits
    try:
        _wait_for(lambda: _training(out) and "[grpo] training" in _log(out / "runs" / "grpo-0.log"))  # it trains
        os.killpg(driver.pid, signal.SIGKILL)
        driver.communicate()
        _wait_for(lambda: not _training(out), 20.0)  # no run outlived it
    finally:
        for pid in _training(out):
            os.kill(int(pid), signal.SIGKILL)
    assert not (out / "runs" / "grpo-0" / "results.json").exists()  # stopped, not trained to its end
    # no run finished, so the folder takes the short settings (the same command would train 4 x 100 steps)
    again = subprocess.run([sys.executable, "-m", "trl_groupopt.cli", "compare", *TINY, "--output_dir", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _records(out) == [(m, s) for m in ("grpo", "otb") for s in (0, 1)]


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_ctrl_c_says_in_one_line_what_was_kept_and_the_resume_command_and_no_token_is_written(tmp_path):
    out = tmp_path / "cmp"
    driver = _start(out, "--hub_tok", TOKEN)
    _wait_for(lambda: (out / "runs.jsonl").exists() and "[otb]" in _log(out / "runs" / "otb-0.log"))
    os.killpg(driver.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the driver's group (each run has its own)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert f"interrupted: 1 finished run(s) kept in {out / 'runs.jsonl'}" in last and TOKEN not in stdout + stderr
    resume = last.split("resume with: ")[1]
    assert resume == f"trl-groupopt compare --methods grpo,otb --seeds 2 --output_dir {out} --baseline grpo " \
        "--eval_examples 8 --max_steps 1 --save_strategy no"  # fmt: skip
    _wait_for(lambda: not _training(out), 20.0)
    again = subprocess.run([sys.executable, "-m", "trl_groupopt.cli", *resume.split()[1:], "--hub_tok", TOKEN],
                           cwd=REPO, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert again.returncode == 0 and _records(out) == [(m, s) for m in ("grpo", "otb") for s in (0, 1)], again.stderr
    for path in out.rglob("*"):  # the runs' logs and folders too
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in again.stdout + again.stderr
