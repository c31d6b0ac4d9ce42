"""A folder that holds only incomplete checkpoints is a fresh start (issue 51, fault campaign: after a SIGKILL that
left only an incomplete checkpoint, or a full disk at the first save, resume said "start a fresh run" and the fresh
run was refused as "already holds checkpoints ... resume it": a circle only --overwrite_output_dir left). The fresh
run keeps them aside in ``incomplete_checkpoints/`` and says so; the full disk's advice no longer leads into a resume
with nothing to resume."""

from __future__ import annotations

import errno
import json
import types

import pytest

from trl_groupopt.cli.main import after_interrupt
from trl_groupopt.runfolder import resume
from trl_groupopt.runfolder.checkpoints import write_checkpoint_record
from trl_groupopt.runfolder.run import open_run


def _args(output_dir, **overrides):
    values = dict(output_dir=str(output_dir), overwrite_output_dir=False, process_index=0, learning_rate=1e-3,
                  per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=2,
                  steps_per_generation=4, num_iterations=1, world_size=1, advantage_estimator="grpo",
                  num_train_epochs=3.0, max_steps=8, save_strategy="steps", save_steps=2)  # fmt: skip
    values.update(overrides)
    return types.SimpleNamespace(**values)


def _cut_short(root, step: int):
    """A save killed before its completion record: the files a SIGKILL or a full disk leaves."""
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "optimizer.pt").write_bytes(b"o" * 3)
    return folder


def _complete(root, step: int):
    folder = _cut_short(root, step)
    write_checkpoint_record(folder)
    return folder


@pytest.mark.parametrize("cli", [True, False])
def test_only_incomplete_checkpoints_are_a_fresh_start_kept_aside(tmp_path, capsys, cli):
    _cut_short(tmp_path, 1)
    _cut_short(tmp_path, 3)
    with pytest.raises(ValueError, match="holds incomplete checkpoints only. Start a fresh run"):
        resume.decide(_args(tmp_path), "echo", "last", cli=cli)
    with pytest.warns(UserWarning, match="Starting afresh") if not cli else _nothing():
        with open_run(_args(tmp_path), "echo", None, cli=cli) as opened:
            assert opened.checkpoint is None and opened.done is None
    said = capsys.readouterr().out
    if cli:
        assert said.startswith(f"Starting afresh in {tmp_path}: it held only incomplete checkpoints (checkpoint-3: ")
        assert f"they are kept in {tmp_path / 'incomplete_checkpoints'}" in said and said.count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "incomplete_checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-3"]
    assert not list(tmp_path.glob("checkpoint-*"))
    _cut_short(tmp_path, 1)  # a second fresh start over another cut-short save keeps both
    with open_run(_args(tmp_path), "echo", None, cli=True):
        pass
    assert (tmp_path / "incomplete_checkpoints" / "checkpoint-1.1").is_dir()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_complete_checkpoint_beside_incomplete_ones_still_refuses_a_fresh_run(tmp_path):
    _complete(tmp_path, 2)
    _cut_short(tmp_path, 4)
    with pytest.raises(ValueError, match=r"already holds checkpoints \(checkpoint-4, checkpoint-2\).*Resume it"):
        resume.decide(_args(tmp_path), "echo", None, cli=True)
    assert (tmp_path / "checkpoint-4").is_dir() and not (tmp_path / "incomplete_checkpoints").exists()


def test_overwrite_deletes_them_as_before_without_setting_aside(tmp_path):
    _cut_short(tmp_path, 1)
    resume.decide(_args(tmp_path, overwrite_output_dir=True), "echo", None, cli=True)
    assert (tmp_path / "checkpoint-1").is_dir() and not (tmp_path / "incomplete_checkpoints").exists()


def test_after_ctrl_c_with_only_an_incomplete_checkpoint_the_advice_is_the_same_command(tmp_path):
    _cut_short(tmp_path, 1)
    said = after_interrupt("trl-groupopt train --method echo", ["--max_steps", "8"], str(tmp_path))
    assert (
        said
        == "No checkpoint was saved, nothing to resume; run it again with: trl-groupopt train --method echo --max_steps 8"
    )


def _disk_full_message(folder) -> str:
    with pytest.raises(OSError) as caught:
        with resume.disk_full_explained(folder):
            raise OSError(errno.ENOSPC, "No space left on device")
    return str(caught.value)


def test_a_full_disk_at_the_first_save_does_not_advise_a_resume(tmp_path):
    first = _disk_full_message(_cut_short(tmp_path, 2))
    assert "--resume_from_checkpoint" not in first and "run it again afresh" in first and "\n" not in first
    _complete(tmp_path, 1)
    later = _disk_full_message(tmp_path / "checkpoint-2")
    assert "then resume with --resume_from_checkpoint last" in later


def test_a_full_disk_at_the_final_save_without_a_checkpoint_advises_overwrite(tmp_path):
    assert "run it again with --overwrite_output_dir" in _disk_full_message(tmp_path)
    _complete(tmp_path, 8)
    assert "resume with --resume_from_checkpoint last, which writes them" in _disk_full_message(tmp_path)
