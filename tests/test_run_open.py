"""Opening a run (`trl_groupopt.runfolder.run.open_run`) and its lock (`trl_groupopt.runfolder.lock.RunLock`): one hold
per folder, taken atomically (of many processes at once exactly one wins, a dead run's lock left or not), released on
exit with the folder it created if the run left it empty, and never a folder with anything in it; the command line's
refusals, and a finished run's exit 0, before the data is read and the model loads; `--overwrite_output_dir` deleting
the earlier run only when training begins. (Training runs: tests/e2e/test_resume_rules.py.)"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket

import pytest

from tests.test_resume_rules import _args, _checkpoint
from trl_groupopt.cli import main as cli
from trl_groupopt.cli import script
from trl_groupopt.data import adapters
from trl_groupopt.runfolder import checkpoints as records
from trl_groupopt.runfolder import resume
from trl_groupopt.runfolder.lock import LOCK_NAME, OutputFolderInUseError, RunLock


# ------------------------------------------------------------------------------------------------ the lock
def _dead_pid() -> int:
    pid = 2**22 - 1
    while pid > 1:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1
    raise AssertionError("no free pid")


def _left_lock(folder, pid: int | None) -> None:
    """The lock file a killed run left (its pid and host; None: an empty file): no process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text("" if pid is None else json.dumps({"pid": pid, "host": socket.gethostname()}))


def test_a_second_hold_of_a_held_folder_refuses_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    with RunLock(out):
        with pytest.raises(
            OutputFolderInUseError, match=rf"{out} is in use by another run \(process {os.getpid()} on"
        ):
            with RunLock(out):  # one hold per run: even this process's second one
                pass
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()  # the first hold is intact
    assert not out.exists()


def test_the_lock_leaves_no_empty_folder_and_never_removes_one_with_anything_in_it(tmp_path):
    """The run's folder goes with the lock only if the lock created it and nothing is in it: a failed run leaves no
    empty folder, and nothing of value (a checkpoint, a file of the user's) is ever deleted."""
    with pytest.raises(RuntimeError, match="boom"), RunLock(tmp_path / "failed"):
        raise RuntimeError("boom")
    assert not (tmp_path / "failed").exists()  # created by the lock, nothing written: removed
    with RunLock(tmp_path / "wrote"):
        (tmp_path / "wrote" / "checkpoint-2").mkdir()
    assert [p.name for p in (tmp_path / "wrote").iterdir()] == ["checkpoint-2"]
    (tmp_path / "mine").mkdir()
    with RunLock(tmp_path / "mine"):
        pass
    assert (tmp_path / "mine").is_dir()  # it was there before: kept, empty as it was
    with RunLock(tmp_path / "other", enabled=False):  # processes other than the main one
        assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("left", ["a killed run's", "empty"])
def test_a_lock_file_no_process_holds_is_taken(tmp_path, left):
    """Issue 46, weak: an empty lock file (a run killed before it wrote its pid) was refused forever. A lock file
    is only a name now: the hold is the kernel's, dropped when its process ended."""
    out = tmp_path / "out"
    pid = _dead_pid() if left == "a killed run's" else None
    _left_lock(out, pid)
    if pid is None:
        with RunLock(out):
            assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    else:
        with pytest.warns(UserWarning, match=rf"left by process {pid} on .*, which ended without releasing it"):
            with RunLock(out):
                assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in out.iterdir()) == []


def _contend(folder: str, barrier, outcome, index: int) -> None:
    """One of several runs starting at once: 1 if it held the folder, 0 if refused, -1 on any other error."""
    try:
        barrier.wait()
        try:
            with RunLock(folder):
                outcome[index] = 1
                barrier.wait()  # held until every contender has tried
        except OutputFolderInUseError:
            outcome[index] = 0
            barrier.wait()
    except Exception:
        outcome[index] = -1
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("left", [None, "dead"], ids=["new folder", "a dead run's lock"])
def test_of_many_runs_starting_at_once_exactly_one_holds_the_folder(tmp_path, left):
    """Issue 46, broken 8: a dead run's lock and two runs starting at once: both held the folder in 21 of 200 tries
    (each took the stale lock over, the second deleting the first's). 60 rounds of 4 processes released together."""
    context = multiprocessing.get_context("fork")
    contenders, rounds, winners = 4, 60, []
    for round_ in range(rounds):
        folder = tmp_path / f"run-{round_}"
        if left == "dead":
            _left_lock(folder, _dead_pid())
        barrier, outcome = context.Barrier(contenders, timeout=60), context.Array("i", [-2] * contenders)
        processes = [context.Process(target=_contend, args=(str(folder), barrier, outcome, i))
                     for i in range(contenders)]  # fmt: skip
        for process in processes:
            process.start()
        for process in processes:
            process.join(120)
        assert -1 not in outcome[:] and -2 not in outcome[:], (round_, outcome[:])
        winners.append(sum(outcome[:]))
        assert not (folder / LOCK_NAME).exists()  # released by the one that held it
    assert winners == [1] * rounds, f"rounds with other than one holder: {[w for w in winners if w != 1]}"


# ------------------------------------------------------------------------------------------------ the command line
FAST = ["--num_train_examples", "16", "--evaluate_accuracy", "false", "--max_steps", "4"]


@pytest.fixture
def no_model(monkeypatch):
    """The data and the model may not load: a refusal must come first (issue 46: after the 200-prompt pass)."""

    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded before the run was refused")

    monkeypatch.setattr(script, "_build_trainer", must_not_load)
    monkeypatch.setattr(adapters, "load_datasets", must_not_load)


@pytest.mark.parametrize("case", ["in use", "another method", "a fresh run over checkpoints", "a damaged path"])
def test_the_command_line_refuses_before_the_model_loads(tmp_path, no_model, case):
    """Issue 46 (the restructuring's regression): each refusal came only after the model loaded and, for the demo,
    after the 200-prompt held-out pass."""
    out = tmp_path / "out"
    _checkpoint(out, 2, max_steps=4)
    argv = {"in use": [], "another method": ["--resume_from_checkpoint", "last"], "a fresh run over checkpoints": [],
            "a damaged path": ["--resume_from_checkpoint", str(out / "checkpoint-2")]}[case]  # fmt: skip
    method = "ctpo" if case == "another method" else "echo"
    if case == "a damaged path":
        (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"x")
    expected = {"in use": (OutputFolderInUseError, "is in use by another run"),
                "another method": (ValueError, "with ctpo: it is a checkpoint of a echo run"),
                "a fresh run over checkpoints": (ValueError, "already holds checkpoints .*--overwrite_output_dir"),
                "a damaged path": (ValueError, r"optimizer.pt is 1 bytes, 16 recorded")}[case]  # fmt: skip
    if case == "in use":
        with RunLock(out), pytest.raises(expected[0], match=expected[1]):
            cli.train(method, [*FAST, "--output_dir", str(out), *argv])
    else:
        with pytest.raises(expected[0], match=expected[1]):
            cli.train(method, [*FAST, "--output_dir", str(out), *argv])
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"]


def _finished_run(out, step: int = 4) -> None:
    """A run folder as the command leaves a finished run: its last checkpoint and its recorded final outputs."""
    _checkpoint(out, step, max_steps=step)
    for name in ("model.safetensors", "config.json", "trainer_state.json", "results.json"):
        (out / name).write_text("{}")
    records.write_final_record(out, step)


def test_a_finished_run_exits_0_before_the_model_loads(tmp_path, no_model, capsys):
    """Issue 46: a finished-run resume exited 0 only after the model loaded and the held-out pass ran."""
    out = tmp_path / "out"
    _finished_run(out)
    with pytest.raises(SystemExit) as finished:
        cli.train("echo", [*FAST, "--output_dir", str(out), "--resume_from_checkpoint", "last"])
    assert finished.value.code == 0
    said = capsys.readouterr().out
    assert said.startswith(f"The run is finished: {out} holds its final model and results, of step 4 of 4")
    assert not (out / LOCK_NAME).exists()


def test_overwrite_deletes_the_earlier_run_only_when_training_begins(tmp_path):
    """A fresh `--overwrite_output_dir` run decides at once and deletes the earlier checkpoints (and the record of
    its final outputs) only when training begins: a run that fails to load its model loses nothing."""
    from trl_groupopt.runfolder.run import open_run

    out = tmp_path / "out"
    _finished_run(out)
    args = _args(output_dir=str(out), overwrite_output_dir=True, max_steps=4)
    with pytest.raises(ValueError, match="cannot be combined"), open_run(args, "echo", "last", cli=True):
        pass
    with open_run(args, "echo", None, cli=True) as opened:
        assert (opened.checkpoint, opened.done, opened.finished) == (None, None, False)
        assert (out / "checkpoint-4").is_dir() and (out / records.FINAL_RECORD).is_file()  # nothing deleted yet
        opened.begin()
        assert not (out / "checkpoint-4").exists() and not (out / records.FINAL_RECORD).exists()
        assert (out / "model.safetensors").is_file()  # replaced by the new run's own save
    with open_run(_args(output_dir=str(tmp_path / "new")), "echo", None, cli=True) as opened:
        assert (opened.checkpoint, opened.finished) == (None, False) and (tmp_path / "new" / LOCK_NAME).is_file()
    assert not (tmp_path / "new").exists()


def test_open_run_decides_once_and_holds_the_lock_while_open(tmp_path, monkeypatch):
    from trl_groupopt.runfolder.run import open_run

    out = tmp_path / "out"
    _checkpoint(out, 2, max_steps=4)
    calls, decide = [], resume.decide
    monkeypatch.setattr(resume, "decide", lambda *a, **k: calls.append(a) or decide(*a, **k))
    with open_run(_args(output_dir=str(out), max_steps=4), "echo", "last", cli=True) as opened:
        assert opened.checkpoint == str(out / "checkpoint-2") and opened.done is None
        with pytest.raises(OutputFolderInUseError), RunLock(out):
            pass
    assert len(calls) == 1 and not (out / LOCK_NAME).exists()


def test_a_failed_run_leaves_no_new_folder_and_keeps_one_that_holds_anything(tmp_path, monkeypatch):
    """`trl-groupopt train` into a new folder that fails before writing anything removes the folder; into a folder
    that holds anything, it removes nothing."""

    def fails(*args, **kwargs):
        raise ValueError("the data is wrong")

    monkeypatch.setattr(adapters, "load_datasets", fails)
    with pytest.raises(ValueError, match="the data is wrong"):
        cli.train("echo", [*FAST, "--output_dir", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="the data is wrong"):
        cli.train("echo", [*FAST, "--output_dir", str(kept)])
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]
