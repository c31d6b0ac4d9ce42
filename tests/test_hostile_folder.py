"""Issue 52: the run's lock (`trl_groupopt.runfolder.lock`), its pid and the vouching command
(`python -m trl_groupopt.runfolder.checkpoints`) in a hostile folder: links, FIFOs, foreign files and pids, read-only
files, a full disk, a live run's lock deleted under it. Nothing outside the folder is written through, nothing hangs,
each refusal is one line naming the file and the fix."""

from __future__ import annotations

import errno
import json
import os
import runpy
import signal
import socket
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trl_groupopt.runfolder import checkpoints
from trl_groupopt.runfolder.checkpoints import CHECKPOINT_RECORD, checkpoint_problem
from trl_groupopt.runfolder.lock import LOCK_NAME, OutputFolderInUseError, RunLock

PRECIOUS = "precious: never to be written by a run\n"


def _precious(tmp_path: Path) -> Path:
    path = tmp_path / "precious.txt"
    path.write_text(PRECIOUS)
    return path


# ---------------------------------------------------------------------------------------------------- the lock
def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    """Broken 1: the lock followed a link at its name and truncated and rewrote the file it named."""
    precious, out = _precious(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(precious)
    with pytest.raises(ValueError, match=rf"{out / LOCK_NAME} is a symbolic link, .* Remove it"), RunLock(out):
        pass
    assert precious.read_text() == PRECIOUS and (out / LOCK_NAME).is_symlink()


def test_a_dangling_lock_link_does_not_create_its_target(tmp_path):
    """Broken 1: a dangling link at the lock's name created the file it named, anywhere."""
    out, target = tmp_path / "out", tmp_path / "elsewhere" / "created.txt"
    out.mkdir()
    target.parent.mkdir()
    (out / LOCK_NAME).symlink_to(target)
    with pytest.raises(ValueError, match="is a symbolic link"), RunLock(out):
        pass
    assert not target.exists()


def test_a_hard_link_or_foreign_file_at_the_lock_s_name_is_never_rewritten(tmp_path):
    """Broken 1: the lock truncated any regular file at its name; it only writes a file it created now."""
    precious, out = _precious(tmp_path), tmp_path / "out"
    out.mkdir()
    os.link(precious, out / LOCK_NAME)
    with pytest.raises(ValueError, match="not a lock file this library wrote"), RunLock(out):
        pass
    assert precious.read_text() == PRECIOUS
    (out / LOCK_NAME).unlink()
    (out / LOCK_NAME).write_text("my notes")
    with pytest.raises(ValueError, match="a file with other content"), RunLock(out):
        pass
    assert (out / LOCK_NAME).read_text() == "my notes"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_as_the_lock_file_is_refused_not_waited_on(tmp_path, kind):
    """Weak: a FIFO at the lock's name hung the run (opening it waited for a writer)."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / LOCK_NAME) if kind == "fifo" else (out / LOCK_NAME).mkdir()

    def hung(signum, frame):
        raise TimeoutError("the lock waited on its file")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(ValueError, match=f"{out / LOCK_NAME} is {'a FIFO' if kind == 'fifo' else 'a folder'}"):
            with RunLock(out):
                pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_deleting_a_live_run_s_lock_file_does_not_let_a_second_run_in(tmp_path):
    """Weak: deleting a live run's lock file let a second run start (with --overwrite_output_dir it deleted the
    first run's checkpoints while both trained). The folder itself is held."""
    out = tmp_path / "out"
    with RunLock(out):
        (out / LOCK_NAME).unlink()
        with pytest.raises(OutputFolderInUseError, match=f"{out} is in use by another run"), RunLock(out):
            pass
        (out / "checkpoint-2").mkdir()
    assert (out / "checkpoint-2").is_dir()


def test_a_left_lock_naming_a_live_process_is_not_called_ended(tmp_path):
    """Weak: a stale lock whose pid names a running process (the pid reused) was reported as "ended"."""
    out = tmp_path / "out"
    out.mkdir()
    live = os.getppid()  # a running process that holds no lock
    (out / LOCK_NAME).write_text(json.dumps({"pid": live, "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match=rf"process {live} on .*, which does not hold it, though a process"):
        with RunLock(out):
            assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_full_disk_while_writing_the_lock_names_the_lock_file(tmp_path, monkeypatch):
    """Weak: a full disk gave `[Errno 28]` without the path; the folder the lock created is not left behind."""
    out = tmp_path / "out"

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match=rf"No space left on device: .*{out / LOCK_NAME}"), RunLock(out):
        pass
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------- vouching
def _their_checkpoint(root: Path, step: int = 6) -> Path:
    """A checkpoint another Trainer wrote: weights, optimizer state, trainer state, no record of ours."""
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(folder / "model.safetensors"))
    torch.save({"state": {0: torch.ones(4)}}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def _vouch(capsys, *names: str | Path) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m trl_groupopt.runfolder.checkpoints NAMES` (in this process)."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        patch.setattr(sys, "argv", ["checkpoints", *map(str, names)])
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before
        try:
            runpy.run_module("trl_groupopt.runfolder.checkpoints", run_name="__main__")
            code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else 1
            sys.stderr.write("" if isinstance(exited.code, int) or exited.code is None else f"{exited.code}\n")
    out, err = capsys.readouterr()
    return code, out, err


def test_vouching_without_an_argument_prints_its_usage_and_fails(capsys):
    """Weak: no argument exited 0, silently."""
    code, _, err = _vouch(capsys)
    assert code == 2 and err.startswith("usage: python -m trl_groupopt.runfolder.checkpoints")


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


DAMAGE = {
    "truncated weights": (lambda f: _truncate(f / "model.safetensors", 200), "model.safetensors holds"),
    "10-byte trainer state": (lambda f: _truncate(f / "trainer_state.json", 10), "trainer_state.json is not a JSON"),
    "no trainer state": (lambda f: (f / "trainer_state.json").unlink(), "no trainer_state.json"),
    "empty folder": (lambda f: [p.unlink() for p in f.iterdir()], "no trainer_state.json"),
    "truncated optimizer": (lambda f: _truncate(f / "optimizer.pt", 100), "optimizer.pt does not load"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_vouching_refuses_a_checkpoint_that_does_not_load(tmp_path, damage, capsys):
    """Weak: a truncated model.safetensors, a 10-byte trainer_state.json, an empty folder or one without a trainer
    state were vouched for; `resume last` then died after the model loaded. Refused, naming the problem."""
    folder = _their_checkpoint(tmp_path)
    harm, said = DAMAGE[damage]
    harm(folder)
    code, _, err = _vouch(capsys, folder)
    assert code == 1 and said in err and "nothing written" in err, err
    assert not (folder / CHECKPOINT_RECORD).exists()


def test_vouching_records_a_checkpoint_that_loads(tmp_path, capsys):
    folder = _their_checkpoint(tmp_path)
    code, out, err = _vouch(capsys, folder)
    assert code == 0 and out == f"recorded {folder}: its files as they are now\n", err
    assert checkpoint_problem(folder) is None and not (tmp_path / LOCK_NAME).exists()


def test_vouching_refuses_a_live_run_s_checkpoint(tmp_path, capsys):
    """Weak: a live run's checkpoint, mid-save, was vouched for: the lock was ignored."""
    folder = _their_checkpoint(tmp_path)
    with RunLock(tmp_path):
        code, _, err = _vouch(capsys, folder)
    assert code == 1 and f"{tmp_path} is in use by another run (process {os.getpid()}" in err
    assert not (folder / CHECKPOINT_RECORD).exists()


def test_vouching_a_read_only_checkpoint_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """Weak: a read-only checkpoint gave an OSError traceback. (The write is refused by a stand-in: as root, a
    read-only mode refuses nothing.)"""
    folder = _their_checkpoint(tmp_path)

    def read_only(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(checkpoints, "write_checkpoint_record", read_only)
    assert checkpoints.vouch([str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Permission denied" in err and f"chmod -R u+w {folder}" in err


def test_the_command_refuses_a_symlinked_lock_in_one_line_before_anything_loads(tmp_path, capsys, monkeypatch):
    """Broken 1 as the campaign ran it: `trl-groupopt train ... --output_dir out` with the lock linked to a file
    outside exited 0 and had overwritten that file."""
    from trl_groupopt.cli import main as cli
    from trl_groupopt.data import adapters

    def data_would_load(*args, **kwargs):
        raise AssertionError("the run went on past its lock")

    monkeypatch.setattr(adapters, "load_datasets", data_would_load)
    precious, out = _precious(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(precious)
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--method", "echo", "--output_dir", str(out), "--max_steps", "2"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.count("\n") == 1 and "is a symbolic link" in err, err
    assert precious.read_text() == PRECIOUS
