"""The output folder of a run (`trl_groupopt.runfolder.checkpoints`, the CLI's use of it): complete checkpoints, which one a
resume takes, the run lock, and the CLI's refusal to start a fresh run over an earlier run's checkpoints.

The checkpoints here are folders of fake files: completeness is decided by the record and the files' sizes and
SHA-256 digests, whatever they hold (real checkpoints: tests/e2e/test_survival.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import types
import warnings

import pytest

from trl_groupopt.cli import main as cli
from trl_groupopt.runfolder import checkpoints as run_folder
from trl_groupopt.runfolder import resume
from trl_groupopt.runfolder.checkpoints import (
    CHECKPOINT_RECORD,
    checkpoint_problem,
    newest_complete_checkpoint,
    resolve_resume,
    write_checkpoint_record,
)
from trl_groupopt.runfolder.lock import LOCK_NAME, OutputFolderInUseError, RunLock


def _cli_trainer(output_dir, overwrite: bool = False) -> types.SimpleNamespace:
    """What the resume rules (`resume.prepare_train`) read of a trainer the command line built."""
    args = types.SimpleNamespace(output_dir=str(output_dir), overwrite_output_dir=overwrite, process_index=0)
    return types.SimpleNamespace(args=args, command_line=True, method_spec=types.SimpleNamespace(name="echo"))


def _checkpoint(root, step, record=True, files=None):
    folder = root / f"checkpoint-{step}"
    (folder / "sub").mkdir(parents=True)
    for name, content in (files or {"model.safetensors": b"w" * 64, "optimizer.pt": b"o" * 128,
                                     "sub/rng_state_1.pth": b"r" * 8, "trainer_state.json": b"{}"}).items():  # fmt: skip
        (folder / name).write_bytes(content)
    if record:
        write_checkpoint_record(folder)
    return folder


def test_record_lists_every_file_and_detects_truncation_and_loss(tmp_path):
    folder = _checkpoint(tmp_path, 4)
    recorded = json.loads((folder / CHECKPOINT_RECORD).read_text())["files"]
    sizes = {name: entry["size"] for name, entry in recorded.items()}
    assert sizes == {"model.safetensors": 64, "optimizer.pt": 128, os.path.join("sub", "rng_state_1.pth"): 8,
                     "trainer_state.json": 2}  # fmt: skip
    assert recorded["optimizer.pt"]["sha256"] == hashlib.sha256(b"o" * 128).hexdigest()
    assert checkpoint_problem(folder) is None
    with open(folder / "optimizer.pt", "r+b") as handle:
        handle.truncate(40)
    assert checkpoint_problem(folder) == "optimizer.pt is 40 bytes, 128 recorded (truncated)"
    (folder / "optimizer.pt").unlink()
    assert checkpoint_problem(folder) == "missing optimizer.pt"
    (folder / CHECKPOINT_RECORD).write_text('{"files": {"model.saf')
    assert "unreadable" in checkpoint_problem(folder)


def _zero_tail(path, nbytes):
    """Overwrite the last `nbytes` of `path` with zeros in place: the size stays (a power loss, a preallocating copy)."""
    with open(path, "r+b") as handle:
        handle.seek(-nbytes, os.SEEK_END)
        handle.write(b"\0" * nbytes)


def test_a_file_of_the_right_size_with_zeroed_bytes_is_refused(tmp_path):
    """Issue 38: the record held sizes only, so a checkpoint whose weights' tail was zeroed passed as complete."""
    folder = _checkpoint(tmp_path, 4)
    _zero_tail(folder / "model.safetensors", 16)
    problem = checkpoint_problem(folder)
    assert problem is not None and problem.startswith("model.safetensors has the recorded size but not the recorded")
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-4: model.safetensors has the recorded"):
        resolve_resume(tmp_path, str(folder))


def test_last_skips_a_damaged_newest_checkpoint_naming_the_file(tmp_path):
    good = _checkpoint(tmp_path, 2)
    damaged = _checkpoint(tmp_path, 4)
    _zero_tail(damaged / "optimizer.pt", 8)
    with pytest.warns(UserWarning, match=r"checkpoint-4: optimizer.pt has the recorded size but not"):
        assert resolve_resume(tmp_path, "last") == str(good)


def test_verification_is_cached_until_a_file_changes(tmp_path, monkeypatch):
    """The CLI and `train()` both verify the checkpoint they resume from: the files are digested once."""
    folder = _checkpoint(tmp_path, 4)
    run_folder._VERIFIED.clear()
    calls = []
    real = run_folder.file_digest
    monkeypatch.setattr(run_folder, "file_digest", lambda path, **kw: calls.append(path) or real(path, **kw))
    assert checkpoint_problem(folder) is None and checkpoint_problem(folder) is None
    assert len(calls) == 4
    _zero_tail(folder / "model.safetensors", 4)
    os.utime(folder / "model.safetensors", ns=(1, 1))  # a new modification time: verified again
    assert "model.safetensors" in checkpoint_problem(folder)


def test_each_file_is_fsynced_before_the_record_which_is_fsynced_too(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    folder = _checkpoint(tmp_path, 4)
    names = [os.path.relpath(p, folder) if isinstance(p, str) else p for p in synced]
    record_at = names.index(f".{CHECKPOINT_RECORD}.tmp")
    for name in ("model.safetensors", "optimizer.pt", os.path.join("sub", "rng_state_1.pth"), "trainer_state.json"):
        assert names.index(name) < record_at, names
    assert names[-1] == "." and "sub" in names[:record_at]  # the folders themselves (their entries) too


def test_a_record_of_sizes_only_is_still_checked_by_size(tmp_path):
    """Records written before digests existed."""
    folder = _checkpoint(tmp_path, 4, record=False)
    (folder / CHECKPOINT_RECORD).write_text(json.dumps({"files": {"model.safetensors": 64, "optimizer.pt": 128}}))
    assert checkpoint_problem(folder) is None
    (folder / "optimizer.pt").write_bytes(b"o")
    assert checkpoint_problem(folder) == "optimizer.pt is 1 bytes, 128 recorded (truncated)"


def test_a_final_output_folder_is_not_a_checkpoint(tmp_path):
    """Issue 38: a run's final output (trainer_state.json parses, no optimizer or RNG state) was resumed from."""
    final = tmp_path / "run"
    final.mkdir()
    for name in ("model.safetensors", "config.json", "trainer_state.json", "results.json"):
        (final / name).write_text("{}")
    with pytest.raises(ValueError) as caught:
        resolve_resume(final, str(final))
    message = str(caught.value)
    assert "it is not a checkpoint" in message and f"--model_name_or_path {final}" in message
    assert f"--resume_from_checkpoint last --output_dir {final}" in message
    # a checkpoint written by another Trainer (no record) is still one, named checkpoint-N or holding its state
    renamed = _checkpoint(tmp_path, 2, record=False)
    assert checkpoint_problem(renamed.rename(tmp_path / "kept")) is None


def test_checkpoints_without_a_record(tmp_path):
    """Written by another Trainer: complete when trainer_state.json (written last by transformers) parses."""
    assert checkpoint_problem(_checkpoint(tmp_path, 2, record=False)) is None
    cut = _checkpoint(tmp_path, 4, record=False, files={"model.safetensors": b"w", "trainer_state.json": b'{"a": '})
    assert "trainer_state.json is cut short" in checkpoint_problem(cut)
    partial = _checkpoint(tmp_path, 6, record=False, files={"model.safetensors": b"w"})
    assert "no trainer_state.json" in checkpoint_problem(partial)
    assert checkpoint_problem(tmp_path / "checkpoint-8") == "it is not a folder"


def test_resume_takes_the_newest_complete_checkpoint_and_names_what_it_skips(tmp_path):
    _checkpoint(tmp_path, 2)
    good = _checkpoint(tmp_path, 10)  # numeric order: 10 is newer than 8 and 2
    _checkpoint(tmp_path, 8)
    truncated = _checkpoint(tmp_path, 12)
    with open(truncated / "model.safetensors", "r+b") as handle:
        handle.truncate(3)
    _checkpoint(tmp_path, 14, record=False, files={"model.safetensors": b"w"})  # killed mid-save
    (tmp_path / "checkpoint-16").write_text("not a folder")
    with pytest.warns(UserWarning) as caught:
        assert resolve_resume(tmp_path, True) == str(good)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert (
        "checkpoint-14" in messages[0] and "no trl_groupopt_checkpoint.json and no trainer_state.json" in messages[0]
    )
    assert "checkpoint-12" in messages[1] and "model.safetensors is 3 bytes, 64 recorded" in messages[1]
    with pytest.warns(UserWarning):
        assert resolve_resume(tmp_path, "last") == str(good)  # the CLI's spelling
    assert resolve_resume(tmp_path, str(good)) == str(good)
    with pytest.raises(ValueError, match=r"checkpoint-12: model.safetensors is 3 bytes.*resume_from_checkpoint=True"):
        resolve_resume(tmp_path, str(truncated))  # an explicit incomplete checkpoint is refused, not swapped
    assert resolve_resume(tmp_path, None) is None and resolve_resume(tmp_path, False) is None


def test_resume_without_a_complete_checkpoint_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="holds no checkpoint. Start a fresh run"):
        resolve_resume(tmp_path, True)
    _checkpoint(tmp_path, 2, record=False, files={"optimizer.pt": b"o"})
    with pytest.warns(UserWarning, match="checkpoint-2"), pytest.raises(ValueError, match="incomplete checkpoints"):
        resolve_resume(tmp_path, "last")
    assert newest_complete_checkpoint(tmp_path / "missing") is None


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


def _lock_of(pid: int, folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))


def test_a_second_run_into_a_held_folder_refuses(tmp_path):
    out = tmp_path / "out"
    _lock_of(os.getppid(), out)  # a live process holds it
    with pytest.raises(OutputFolderInUseError, match=rf"{out} is in use by another run \(process {os.getppid()}"):
        with RunLock(out):
            pass
    assert (out / LOCK_NAME).exists()  # not ours: left alone


def test_the_lock_is_released_on_exit_reentrant_and_leaves_no_empty_folder(tmp_path):
    out = tmp_path / "new"
    with RunLock(out):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
        with RunLock(out):  # the trainer's train() inside the CLI's run
            pass
        assert (out / LOCK_NAME).exists()  # the inner exit keeps the outer hold
        (out / "model.safetensors").write_bytes(b"w")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    with pytest.raises(RuntimeError, match="boom"), RunLock(tmp_path / "failed"):
        raise RuntimeError("boom")
    assert not (tmp_path / "failed").exists()  # created by the lock, nothing written: removed
    with RunLock(tmp_path / "other", enabled=False):  # processes other than the main one
        assert not (tmp_path / "other").exists()


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path):
    out = tmp_path / "out"
    pid = _dead_pid()
    _lock_of(pid, out)
    with pytest.warns(UserWarning, match=rf"left by process {pid}, which no longer exists"), RunLock(out):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (out / LOCK_NAME).exists()


# ------------------------------------------------------------------------------------------------ the CLI
FAST = ["--num_train_examples", "16", "--evaluate_accuracy", "false", "--max_steps", "1"]


def test_save_steps_alone_saves_and_the_demo_keeps_two_checkpoints(tmp_path):
    _, args, _, _ = cli.parse("echo", [])
    assert (args.save_strategy, args.save_steps, args.save_total_limit) == ("steps", 20, 2)
    _, args, _, _ = cli.parse("echo", ["--save_strategy", "no", "--save_steps", "4"])
    assert args.save_strategy == "no"  # an explicit strategy wins
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    config = tmp_path / "run.yaml"
    config.write_text("save_strategy: epoch\n")
    for argv, strategy in (
        (["--save_steps", "4"], "steps"),
        (["--save_steps=4", "--config", str(config)], "epoch"),
        (["--save_steps", "4", "--model_name_or_path", str(model_dir)], "steps"),
    ):
        _, args, _, _ = cli.parse("echo", argv)
        assert args.save_strategy == strategy, argv
    config.write_text("save_steps: 3\n")
    _, args, _, _ = cli.parse("dfpo", ["--config", str(config), "--save_strategy", "no"])
    assert args.save_strategy == "no"
    _, args, _, _ = cli.parse("dfpo", ["--config", str(config)])
    assert (args.save_strategy, args.save_steps) == ("steps", 3)


def test_the_demo_defaults_for_benchmarks_save_nothing():
    assert cli.DEMO_DEFAULTS["save_strategy"] == "no"


def test_a_fresh_run_over_checkpoints_refuses_naming_both_ways_on(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out, 4)
    with pytest.raises(ValueError) as refused:
        cli.train("echo", [*FAST, "--output_dir", str(out)])
    message = str(refused.value)
    for part in ("already holds checkpoints", "checkpoint-4", "--resume_from_checkpoint last", "--output_dir",
                 "--overwrite_output_dir"):  # fmt: skip
        assert part in message, part
    assert (out / "checkpoint-4").is_dir() and not (out / LOCK_NAME).exists()
    with pytest.raises(ValueError, match="cannot be combined"):
        resume.prepare_train(_cli_trainer(out, overwrite=True), "last")
    assert resume.prepare_train(_cli_trainer(out, overwrite=True), None) == (None, None)
    assert not (out / "checkpoint-4").exists()  # --overwrite_output_dir: the earlier checkpoints are gone
    assert resume.prepare_train(_cli_trainer(tmp_path / "fresh"), None) == (None, None)


def test_cli_resume_last_names_the_checkpoint(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out, 2)
    _checkpoint(out, 4, record=False, files={"model.safetensors": b"w"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resume.prepare_train(_cli_trainer(out), "last") == (str(out / "checkpoint-2"), None)
    assert any("checkpoint-4" in str(w.message) for w in caught)


def test_cli_refuses_a_folder_in_use(tmp_path):
    out = tmp_path / "busy"
    _lock_of(os.getppid(), out)
    with pytest.raises(OutputFolderInUseError, match="is in use by another run"):
        cli.train("echo", [*FAST, "--output_dir", str(out)])
