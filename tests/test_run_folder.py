"""The checkpoints of a run's output folder (`trl_groupopt.runfolder.checkpoints`): complete checkpoints, which one a
resume takes, and the CLI's save defaults (the lock and the opening of a run: tests/test_run_open.py).

The checkpoints here are folders of fake files: completeness is decided by the record and the files' sizes and
SHA-256 digests, whatever they hold (real checkpoints: tests/e2e/test_survival.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import warnings

import pytest

from trl_groupopt.cli import main as cli
from trl_groupopt.runfolder import checkpoints as run_folder
from trl_groupopt.runfolder.checkpoints import (
    CHECKPOINT_RECORD,
    checkpoint_problem,
    newest_complete_checkpoint,
    resolve_resume,
    write_checkpoint_record,
)


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
    sizes = {"model.safetensors": 64, "optimizer.pt": 128, "trainer_state.json": 2}
    (folder / CHECKPOINT_RECORD).write_text(json.dumps({"files": sizes}))
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
    # a checkpoint folder without a record, named checkpoint-N or holding training state, is one, but unvouched
    renamed = _checkpoint(tmp_path, 2, record=False)
    assert checkpoint_problem(renamed.rename(tmp_path / "kept")) == run_folder.NO_RECORD


def test_a_checkpoint_without_a_record_is_incomplete_even_when_its_state_parses(tmp_path):
    """Issue 46, broken 1: a checkpoint without a record passed whenever trainer_state.json parsed, even with a
    corrupt model.safetensors, no warning: a save cut short (a re-save killed after it removed the old record, the
    old trainer_state.json still there) looks just like that. Without a record it is incomplete, and `last` skips
    it, naming why."""
    good = _checkpoint(tmp_path, 2)
    files = {"model.safetensors": b"corrupt", "optimizer.pt": b"o" * 128, "trainer_state.json": b'{"global_step": 4}'}
    unrecorded = _checkpoint(tmp_path, 4, record=False, files=files)
    with pytest.warns(UserWarning, match=r"checkpoint-4: no trl_groupopt_checkpoint.json: its save was cut short"):
        assert resolve_resume(tmp_path, "last") == str(good)
    assert checkpoint_problem(unrecorded) == run_folder.NO_RECORD
    partial = _checkpoint(tmp_path, 6, record=False, files={"model.safetensors": b"w"})
    assert checkpoint_problem(partial) == run_folder.NO_RECORD
    assert checkpoint_problem(tmp_path / "checkpoint-8") == "it is not a folder"


def test_an_interrupted_resave_of_a_damaged_checkpoint_is_not_resumed(tmp_path):
    """Issue 46, broken 1 (3 of 3): a flipped byte in checkpoint-4/optimizer.pt is skipped; the re-save at step 4
    removes the record first, and a SIGKILL during it left the damaged optimizer.pt, no record and the old
    trainer_state.json; the next `last` resumed that folder, no warning. (The trainer's re-save in a real run:
    tests/e2e/test_survival.py.)"""
    good = _checkpoint(tmp_path, 2)
    damaged = _checkpoint(tmp_path, 4)
    with open(damaged / "optimizer.pt", "r+b") as handle:
        handle.seek(17)
        handle.write(bytes([handle.read(1)[0] ^ 0xFF]))
    with pytest.warns(UserWarning, match="checkpoint-4: optimizer.pt has the recorded size but not"):
        assert resolve_resume(tmp_path, "last") == str(good)
    (damaged / CHECKPOINT_RECORD).unlink()  # the re-save's first step (`remove_record`), then the kill
    with pytest.warns(UserWarning, match="checkpoint-4: no trl_groupopt_checkpoint.json"):
        assert resolve_resume(tmp_path, "last") == str(good)
    with pytest.raises(
        ValueError, match=r"checkpoint-4: no trl_groupopt_checkpoint.json.*resume_from_checkpoint=True"
    ):
        resolve_resume(tmp_path, str(damaged))


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({}, "lists no files"),
        ({"model.safetensors": {"size": 64, "sha256": "0" * 64}}, "does not list trainer_state.json"),
        ({"trainer_state.json": {"sha256": "0" * 64}}, "the entry of trainer_state.json has no valid size"),
        ({"trainer_state.json": {"size": "2", "sha256": "0" * 64}}, "the entry of trainer_state.json has no valid"),
        ({"trainer_state.json": {"size": None}}, "the entry of trainer_state.json has no valid size"),
        ({"trainer_state.json": {"size": 2.0}}, "the entry of trainer_state.json has no valid size"),
        ({"trainer_state.json": {"size": True}}, "the entry of trainer_state.json has no valid size"),
        ({"trainer_state.json": {"size": -2}}, "the entry of trainer_state.json has no valid size"),
        ({"trainer_state.json": {"size": 2, "sha256": 5}}, "the entry of trainer_state.json has no valid size or"),
        ({"trainer_state.json": [2]}, "the entry of trainer_state.json has no valid size"),
    ],
    ids=["no files", "no state", "no size", "size a string", "size null", "size a float", "size a bool",
         "size negative", "digest a number", "entry a list"],
)  # fmt: skip
def test_a_malformed_record_is_skipped_by_last_not_a_crash(tmp_path, files, why):
    """Issue 46, broken 1 (`{"files": {}}` was accepted) and weak (an entry without a size, or a size that is not a
    number, raised a TypeError and `last` aborted): the checkpoint is skipped, naming the entry."""
    good = _checkpoint(tmp_path, 2)
    bad = _checkpoint(tmp_path, 4, record=False)
    (bad / CHECKPOINT_RECORD).write_text(json.dumps({"files": files, "run": {}}))
    assert why in checkpoint_problem(bad)
    with pytest.warns(UserWarning, match=f"checkpoint-4: {CHECKPOINT_RECORD} "):
        assert resolve_resume(tmp_path, "last") == str(good)


def test_a_checkpoint_another_trainer_wrote_is_vouched_for_by_recording_it(tmp_path, monkeypatch, capsys):
    """The one way to resume a checkpoint without a record (GRPOTrainer's, say): the refusal names the command that
    records its files as they are; after it, the checkpoint resumes."""
    from tests.test_hostile_folder import _their_checkpoint

    theirs = _their_checkpoint(tmp_path, 6)  # files that load (issue 52: vouching checks them)
    with pytest.raises(ValueError) as refused:
        resolve_resume(tmp_path, str(theirs))
    command = f"python -m trl_groupopt.runfolder.checkpoints {theirs}"
    assert str(refused.value).endswith(f"record them first: {command}.")
    monkeypatch.setattr("sys.argv", command.split()[2:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before
        with pytest.raises(SystemExit, match="0"):
            runpy.run_module("trl_groupopt.runfolder.checkpoints", run_name="__main__")
        assert capsys.readouterr().out == f"recorded {theirs}: its files as they are now\n"
        assert resolve_resume(tmp_path, str(theirs)) == str(theirs)
        with pytest.raises(SystemExit):
            runpy.run_module("trl_groupopt.runfolder.checkpoints", run_name="__main__")
        assert "it is recorded and complete already; nothing written" in capsys.readouterr().err


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
    assert "checkpoint-14" in messages[0] and "no trl_groupopt_checkpoint.json: its save was cut short" in messages[0]
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


# ------------------------------------------------------------------------------------------------ the CLI
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
