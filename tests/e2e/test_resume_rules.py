"""The resume rules (issue 38; `trl_groupopt/runfolder/resume.py`) on real runs of the tiny policy, through the Python API and
the command line: another method's checkpoint, a changed learning rate, a finished run, a final output folder given
as a checkpoint, a fresh run over an earlier one, and the tied-weight "missing keys" message on resume."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging

from tests.helpers import clone_model, method_trainer, tiny_model, tiny_tokenizer
from trl_groupopt.cli import main as cli


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=5)


def _trainer(tiny, output_dir, method="echo", max_steps=2, **overrides):
    tokenizer, model = tiny
    kwargs = dict(num_examples=32, max_steps=max_steps, per_device_train_batch_size=4, num_generations=2,
                  steps_per_generation=2, gradient_accumulation_steps=1, save_strategy="steps", save_steps=2,
                  disable_tqdm=True)  # fmt: skip
    kwargs.update(overrides)
    return method_trainer(method, output_dir, clone_model(model), tokenizer, **kwargs)


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _cli_args(output_dir: Path, *extra: str) -> list[str]:
    return ["--output_dir", str(output_dir), "--max_steps", "2", "--save_steps", "2", "--num_train_examples", "32",
            "--per_device_train_batch_size", "4", "--num_generations", "2", "--gradient_accumulation_steps", "1",
            "--steps_per_generation", "2", "--max_completion_length", "8", "--evaluate_accuracy", "false",
            *extra]  # fmt: skip


# ------------------------------------------------------------------------------------------------ the Python API
def test_api_refuses_another_methods_checkpoint(tmp_path, tiny):
    _trainer(tiny, tmp_path, "echo").train()
    other = _trainer(tiny, tmp_path, "ctpo", max_steps=4)
    with pytest.raises(ValueError, match=r"with ctpo: it is a checkpoint of a echo run.*--model_name_or_path"):
        other.train(resume_from_checkpoint=True)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]


def test_api_changed_learning_rate_warns_and_the_restored_one_is_recorded(tmp_path, tiny):
    """Issue 38: the restored scheduler kept 1e-4 while training_args.bin and the card said 0.01."""
    _trainer(tiny, tmp_path, learning_rate=1e-4).train()
    resumed = _trainer(tiny, tmp_path, max_steps=4, learning_rate=0.01)
    with pytest.warns(UserWarning, match=r"learning_rate 0.0001 -> 0.01"):
        resumed.train(resume_from_checkpoint=True)
    assert resumed.args.learning_rate == 1e-4
    logged = [e["learning_rate"] for e in resumed.state.log_history if "learning_rate" in e and e["step"] > 2]
    assert logged and max(logged) <= 1e-4  # what the optimizer used
    saved = torch.load(tmp_path / "checkpoint-4" / "training_args.bin", weights_only=False)
    assert saved.learning_rate == 1e-4


def test_api_finished_run_is_not_trained_past_max_steps(tmp_path, tiny):
    """Issue 38: resuming an 8-step run printed step 9/8, wrote checkpoint-9 and rotated an older one away."""
    first = _trainer(tiny, tmp_path, save_total_limit=1)
    first.train()
    trained = {n: p.detach().clone() for n, p in first.model.named_parameters()}
    before = _snapshot(tmp_path)
    again = _trainer(tiny, tmp_path, save_total_limit=1)
    with pytest.warns(UserWarning, match=r"The run is finished: .*checkpoint-2 is at step 2 of 2"):
        output = again.train(resume_from_checkpoint=True)
    assert output.global_step == 2 and again.state.global_step == 2
    assert _snapshot(tmp_path) == before  # no new checkpoint, no rotation, nothing rewritten
    for name, value in trained.items():  # the trainer holds the finished run's weights, as after its train()
        assert torch.equal(again.model.get_parameter(name).detach(), value), name


@pytest.mark.parametrize("left", ["checkpoints", "finished run"])
def test_api_fresh_run_into_an_earlier_run_refuses_unless_overwrite(tmp_path, tiny, left):
    """Issue 38: `ECHOTrainer(...).train()` into a folder holding checkpoints overwrote and rotated them."""
    if left == "checkpoints":
        _trainer(tiny, tmp_path).train()
    else:
        first = _trainer(tiny, tmp_path, save_strategy="no")
        first.train()
        first.save_model()
    before = _snapshot(tmp_path)
    fresh = _trainer(tiny, tmp_path)
    with pytest.raises(ValueError, match=r"already holds .* of an earlier run"):
        fresh.train()
    assert _snapshot(tmp_path) == before
    fresh.args.overwrite_output_dir = True
    fresh.train()


def test_tied_weights_are_not_reported_missing_on_resume(tmp_path, tiny):
    """Issue 38: a resumed run of the tied-embedding policy printed `missing keys ... ['lm_head.weight']`."""
    _trainer(tiny, tmp_path).train()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    try:
        _trainer(tiny, tmp_path, max_steps=4).train(resume_from_checkpoint=True)
    finally:
        logger.removeHandler(handler)
    assert not [r.getMessage() for r in records if "missing keys" in r.getMessage()]
    assert tiny[1].config.tie_word_embeddings  # the case the filter is for


# ------------------------------------------------------------------------------------------------ the command line
def test_cli_resume_of_a_finished_run_exits_0_with_nothing_changed(tmp_path, capsys):
    out = tmp_path / "run"
    cli.train("echo", _cli_args(out))
    before = _snapshot(out)
    assert "results.json" in before and "checkpoint-2/model.safetensors" in before
    capsys.readouterr()
    with pytest.raises(SystemExit) as caught:
        cli.train("echo", _cli_args(out, "--resume_from_checkpoint", "last"))
    assert caught.value.code == 0 and "The run is finished" in capsys.readouterr().out
    assert _snapshot(out) == before
    with pytest.raises(ValueError, match="with ctpo: it is a checkpoint of a echo run"):
        cli.train("ctpo", _cli_args(out, "--max_steps", "4", "--resume_from_checkpoint", "last"))
    with pytest.raises(ValueError, match="it is not a checkpoint"):  # the final output folder
        cli.train("echo", _cli_args(out, "--max_steps", "4", "--resume_from_checkpoint", str(out)))
    assert _snapshot(out) == before


def test_cli_two_runs_without_checkpoints_into_one_folder(tmp_path):
    """Issue 38: the second `--save_strategy no` run replaced the first's model, card and results.json."""
    out = tmp_path / "run"
    cli.train("echo", _cli_args(out, "--save_strategy", "no"))
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"already holds a finished run .*--overwrite_output_dir"):
        cli.train("ctpo", _cli_args(out, "--save_strategy", "no"))
    assert _snapshot(out) == before
    cli.train("ctpo", _cli_args(out, "--save_strategy", "no", "--overwrite_output_dir"))
    assert _snapshot(out)["results.json"] != before["results.json"]


# ------------------------------------------------------------------------------------------------ issue 46
def test_one_lock_and_one_resume_check_per_run(tmp_path, tiny, monkeypatch):
    """The command line opens the run before the model loads and hands it to `train()`, which opens one itself only
    when nobody did (the Python API): one hold of the lock and one pass of the resume rules per run, either way."""
    from trl_groupopt.runfolder import lock, resume

    holds, checks = [], []
    enter, decide = lock.RunLock.__enter__, resume.decide
    monkeypatch.setattr(lock.RunLock, "__enter__", lambda self: holds.append(self.enabled) or enter(self))
    monkeypatch.setattr(resume, "decide", lambda *a, **k: checks.append(a[2]) or decide(*a, **k))
    cli.train("echo", _cli_args(tmp_path / "run"))
    cli.train("echo", _cli_args(tmp_path / "run", "--max_steps", "4", "--resume_from_checkpoint", "last"))
    assert (holds, checks) == ([True, True], [None, "last"])
    _trainer(tiny, tmp_path / "api").train()
    assert (holds[2:], checks[2:]) == ([True], [None])


def _final_save_fails(monkeypatch, out: Path, how: str) -> None:
    """The first run's end: Ctrl-C in the held-out pass after training, or a full disk writing the final model."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    from trl_groupopt.cli import script

    if how == "ctrl-c in the held-out pass":
        measure, calls = script.offline.greedy_accuracy, []

        def interrupted_after(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:  # the pass after training
                raise KeyboardInterrupt
            return measure(*args, **kwargs)

        monkeypatch.setattr(script.offline, "greedy_accuracy", interrupted_after)
        return
    save = transformers.modeling_utils.safe_save_file

    def full_disk(tensors, filename, *args, **kwargs):
        if Path(filename).parent == out:
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')  # fmt: skip
        return save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)


@pytest.mark.parametrize("how", ["ctrl-c in the held-out pass", "disk full on the final save"])
def test_a_run_stopped_after_training_writes_its_outputs_on_resume(tmp_path, capsys, monkeypatch, how):
    """Issue 46, broken 2: stopped after its last step (Ctrl-C in the held-out pass, or ENOSPC writing
    model.safetensors, which also gave a raw `SafetensorError` traceback), the run had a checkpoint at max_steps and
    no model or results.json, and every resume said "The run is finished ... Nothing was trained or written", exit 0.
    Now the resume writes the final outputs from that checkpoint, without training; then the run is finished."""
    out = tmp_path / "run"
    argv = _cli_args(out, "--evaluate_accuracy", "true", "--num_eval_examples", "8", "--heldout_eval_steps", "0")
    with monkeypatch.context() as patched:
        _final_save_fails(patched, out, how)
        with pytest.raises(SystemExit) as stopped:
            cli.main(["train", "--method", "echo", *argv])
    err = capsys.readouterr().err
    if how == "disk full on the final save":  # one line, not the SafetensorError traceback
        last = err.strip().splitlines()[-1]  # after the loading bars and warnings
        assert stopped.value.code == 1 and "Traceback" not in err and "SafetensorError" not in err
        assert last.startswith(f"trl-groupopt train --method echo: error: [Errno 28] No space left on the device while "
                               f"saving {out} ") and "final outputs there are" in last  # fmt: skip
    else:
        assert stopped.value.code == 130 and err.strip().endswith("--resume_from_checkpoint last")
    assert not (out / "results.json").exists() and (out / "checkpoint-2" / "trl_groupopt_checkpoint.json").exists()
    resumed = cli.train("echo", [*argv, "--resume_from_checkpoint", "last"])
    said = capsys.readouterr().out
    assert f"{out / 'checkpoint-2'} is at the run's last step (2 of 2), but its final outputs are not complete" in said
    assert "training 2 steps" not in said and resumed.state.global_step == 2  # nothing trained
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 2 and results["heldout_examples"] == 8
    assert 0.0 <= results["accuracy_before"] <= 1.0 and 0.0 <= results["accuracy_after"] <= 1.0
    final, saved = (
        load_file(str(out / "model.safetensors")),
        load_file(str(out / "checkpoint-2" / "model.safetensors")),
    )
    assert final.keys() == saved.keys() and all(torch.equal(final[k], saved[k]) for k in final)
    before = _snapshot(out)
    with pytest.raises(SystemExit) as finished:
        cli.train("echo", [*argv, "--resume_from_checkpoint", "last"])
    assert finished.value.code == 0 and "The run is finished" in capsys.readouterr().out
    assert _snapshot(out) == before
