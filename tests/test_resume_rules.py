"""The resume rules of `trl_groupopt.runfolder.resume` on folders of fake files (training runs: tests/e2e/test_resume_rules.py):
a fresh run over an earlier one, another method's checkpoint, changed settings, a finished run, a full disk, the
generation-cycle warning, and the tied-weight filter of "missing keys"."""

from __future__ import annotations

import errno
import json
import types

import pytest
import torch

from trl_groupopt.runfolder import checkpoints as records
from trl_groupopt.runfolder import resume
from trl_groupopt.runfolder.checkpoints import write_checkpoint_record


def _args(**overrides) -> types.SimpleNamespace:
    values = dict(output_dir="unused", learning_rate=1e-3, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  num_generations=2, steps_per_generation=4, num_iterations=1, world_size=1,
                  advantage_estimator="grpo", num_train_epochs=3.0, max_steps=8, save_strategy="steps", save_steps=2)  # fmt: skip
    values.update(overrides)
    return types.SimpleNamespace(**values)


def _run_args(output_dir, overwrite: bool = False, **overrides) -> types.SimpleNamespace:
    """What the resume rules (`resume.decide`) read of a run's settings."""
    return _args(output_dir=str(output_dir), overwrite_output_dir=overwrite, process_index=0, **overrides)


def _checkpoint(root, step: int, method: str = "echo", max_steps: int = 8, **settings):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes(b"o" * 16)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": max_steps}))
    trainer = types.SimpleNamespace(
        args=_args(max_steps=max_steps, **settings), method_spec=types.SimpleNamespace(name=method)
    )
    write_checkpoint_record(folder, resume.run_record(trainer))
    return folder


# ------------------------------------------------------------------------------------------------ fresh runs
@pytest.mark.parametrize("left", ["checkpoint", "finished"])
def test_a_fresh_run_over_an_earlier_run_refuses_unless_overwrite(tmp_path, left):
    """Issue 38: the Python API trained over checkpoints, and `--save_strategy no` runs replaced each other."""
    if left == "checkpoint":
        _checkpoint(tmp_path, 6)
    else:
        (tmp_path / "model.safetensors").write_bytes(b"w")
        (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds .* of an earlier run.*train\(resume_from_checkpoint=True\)"):
        resume.refuse_fresh_run(tmp_path, overwrite=False)
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint last .*--overwrite_output_dir"):
        resume.refuse_fresh_run(tmp_path, overwrite=False, cli=True)
    resume.refuse_fresh_run(tmp_path, overwrite=True)
    with pytest.raises(ValueError, match="already holds .*--overwrite_output_dir"):
        resume.decide(_run_args(tmp_path), "echo", None, cli=True)


def test_a_folder_with_other_files_only_is_not_an_earlier_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "_trl_groupopt.lock").write_text("{}")
    resume.refuse_fresh_run(tmp_path, overwrite=False)
    resume.refuse_fresh_run(tmp_path / "missing", overwrite=False)


# ------------------------------------------------------------------------------------------------ the checkpoint
def test_another_method_is_refused_naming_both_and_the_way_to_its_weights(tmp_path):
    folder = _checkpoint(tmp_path, 4, method="echo")
    with pytest.raises(ValueError) as caught:
        resume.check_resume(str(folder), "ctpo", _args())
    message = str(caught.value)
    assert "with ctpo" in message and "of a echo run" in message and "--method echo" in message
    assert f"--model_name_or_path {folder}" in message
    with pytest.raises(ValueError, match="of a echo run"):
        resume.decide(_run_args(tmp_path), "ctpo", "last", cli=True)


def test_changed_settings_warn_and_the_learning_rate_is_restored(tmp_path):
    folder = _checkpoint(tmp_path, 4, learning_rate=1e-4, num_generations=2)
    args = _args(learning_rate=0.01, num_generations=4)
    with pytest.warns(UserWarning, match=r"learning_rate 0.0001 -> 0.01, num_generations 2 -> 4\.") as caught:
        resume.check_resume(str(folder), "echo", args)
    assert args.learning_rate == 1e-4  # what the restored optimizer and scheduler use, so what the card records
    assert "batch and group settings given now are used" in str(caught[0].message)


def test_a_run_at_its_last_step_is_named_in_the_words_of_its_caller(tmp_path):
    folder = _checkpoint(tmp_path, 8, max_steps=8)
    assert resume.training_complete(str(folder), _args(max_steps=8)) == (8, 8)
    assert resume.training_complete(str(folder), _args(max_steps=12)) is None  # raised: it trains on
    assert resume.training_complete(str(folder), _args(max_steps=-1)) == (8, 8)  # by epochs: the planned 8 steps
    assert resume.training_complete(str(folder), _args(max_steps=-1, num_train_epochs=6.0)) is None
    # `train()` loads the checkpoint, warns and returns (tests/e2e/test_resume_rules.py)
    checkpoint, done, finished = resume.decide(_run_args(tmp_path, max_steps=8), "echo", True)
    assert (checkpoint, finished) == (str(folder), False)
    assert "checkpoint-8 is at step 8 of 8" in done and "raise max_steps to train on" in done


def _final_outputs(out, step: int) -> None:
    for name in ("model.safetensors", "results.json"):
        (out / name).write_text(name)
    records.write_final_record(out, step)


def test_the_command_line_finishes_a_run_only_with_its_final_outputs_complete(tmp_path):
    """Issue 46, broken 2: Ctrl-C in the held-out pass after training, or a full disk at the final save, left a
    checkpoint at the last step and no model or results.json; every resume said "The run is finished ... Nothing
    was trained or written" and exited 0. A run is finished when its final outputs are complete on disk, recorded
    (`FINAL_RECORD`) and of the checkpoint's step; else the command writes them from that checkpoint."""
    folder = _checkpoint(tmp_path, 8, max_steps=8)
    args = _run_args(tmp_path, max_steps=8)
    checkpoint, done, finished = resume.decide(args, "echo", "last", cli=True)
    assert (checkpoint, finished) == (str(folder), False)
    assert done.startswith(f"{folder} is at the run's last step (8 of 8), but its final outputs are not complete")
    assert done.endswith(f"(no {records.FINAL_RECORD}): writing them from that checkpoint, without training.")
    _final_outputs(tmp_path, 8)
    checkpoint, done, finished = resume.decide(args, "echo", "last", cli=True)
    assert finished and done.startswith(f"The run is finished: {tmp_path} holds its final model and results")
    assert "--max_steps to train on" in done
    (tmp_path / "results.json").write_text("results.jsoX")  # changed after the save (the same size)
    assert "results.json has the recorded size but not" in resume.decide(args, "echo", "last", cli=True)[1]
    _final_outputs(tmp_path, 6)  # the outputs of an earlier stretch of the run, resumed since to step 8
    _, done, finished = resume.decide(args, "echo", "last", cli=True)
    assert not finished and "(they are of step 6, not 8)" in done
    (tmp_path / "model.safetensors").unlink()
    assert "missing model.safetensors" in resume.decide(args, "echo", "last", cli=True)[1]


# ------------------------------------------------------------------------------------------------ saving
def test_a_full_disk_says_so_naming_the_folder(tmp_path, monkeypatch):
    """Issue 38: torch's writer said only `basic_ios::clear: iostream error`."""
    with pytest.raises(OSError) as caught:
        with resume.disk_full_explained(tmp_path / "checkpoint-4"):
            raise OSError(errno.ENOSPC, "No space left on device")
    message = str(caught.value)
    assert "No space left on the device while saving" in message and "checkpoint-4" in message
    assert "skipped on resume" in message and "\n" not in message
    monkeypatch.setattr(resume.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=4096))
    with pytest.raises(OSError, match="No space left on the device"):
        with resume.disk_full_explained(tmp_path / "checkpoint-4"):
            raise RuntimeError("basic_ios::clear: iostream error")
    monkeypatch.setattr(resume.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=1 << 40))
    with pytest.raises(RuntimeError, match="iostream"):  # with space left: another error, passed on as it is
        with resume.disk_full_explained(tmp_path):
            raise RuntimeError("basic_ios::clear: iostream error")


#: What safetensors' writer raises on a full disk (its Rust `io::Error`, debug-formatted)
SAFETENSORS_ENOSPC = (
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


def test_a_full_disk_while_writing_safetensors_is_one_line_too(tmp_path, monkeypatch):
    """Issue 46, weak: ENOSPC while writing model.safetensors gave a raw `SafetensorError` traceback (the explanation
    took OSError and RuntimeError only). The final output folder's line says how its outputs are written again; a
    save inside another (the model inside a checkpoint) is explained once."""
    from safetensors import SafetensorError

    monkeypatch.setattr(resume.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=1 << 40))
    _checkpoint(
        tmp_path / "out", 8
    )  # the outputs are written again from it (without one: tests/test_incomplete_checkpoints.py)
    with pytest.raises(resume.DiskFullError) as caught:
        with resume.disk_full_explained(tmp_path / "out"):
            raise SafetensorError(SAFETENSORS_ENOSPC)
    message = str(caught.value)
    assert message.startswith(f"[Errno 28] No space left on the device while saving {tmp_path / 'out'}")
    assert "final outputs there are incomplete" in message and "--resume_from_checkpoint last, which writes" in message
    with pytest.raises(resume.DiskFullError) as caught:
        with resume.disk_full_explained(tmp_path / "checkpoint-4"), resume.disk_full_explained(tmp_path / "x"):
            raise SafetensorError(SAFETENSORS_ENOSPC)
    assert str(caught.value).count("No space left on the device") == 1 and "checkpoint-4" not in str(caught.value)
    with pytest.raises(SafetensorError, match="header too large"):  # any other error: passed on as it is
        with resume.disk_full_explained(tmp_path / "out"):
            raise SafetensorError("Error while serializing: header too large")


@pytest.mark.parametrize(
    ("save_steps", "accumulation", "per_generation", "iterations", "warns"),
    [
        (5, 1, 4, 1, True),
        (4, 1, 4, 1, False),
        (2, 2, 4, 1, False),
        (1, 2, 4, 1, True),
        (3, 2, 2, 3, False),
        (2, 2, 2, 3, True),
    ],  # fmt: skip
)
def test_save_steps_off_the_generation_cycle_warns(save_steps, accumulation, per_generation, iterations, warns):
    args = _args(save_steps=save_steps, gradient_accumulation_steps=accumulation,
                 steps_per_generation=per_generation, num_iterations=iterations)  # fmt: skip
    message = resume.inexact_resume_warning(args)
    assert (message is not None) == warns, message
    if warns:
        assert f"save_steps={save_steps}" in message and "exact resume" in message
    assert resume.inexact_resume_warning(_args(save_steps=5, save_strategy="no")) is None


def test_only_tied_weights_are_dropped_from_missing_keys():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(4, 2)
    model.head = torch.nn.Linear(2, 4, bias=False)
    model.head.weight = model.embed.weight  # tied
    model.other = torch.nn.Linear(2, 2)
    assert resume.missing_keys_to_report(model, ["head.weight"]) == []
    assert resume.missing_keys_to_report(model, ["head.weight", "other.weight"]) == ["other.weight"]
    assert resume.missing_keys_to_report(model, ["head.weight", "embed.weight"]) == ["head.weight", "embed.weight"]
