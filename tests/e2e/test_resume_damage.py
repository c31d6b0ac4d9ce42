"""Issue 46's kills on real runs (tests/e2e/test_survival.py has the others): a re-save of a damaged checkpoint killed
midway is not resumed; rotation keeps the last complete checkpoint until the next one is recorded; SIGTERM to the
command is handled as Ctrl-C (one line naming the resume command, the lock released, exit 143)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.e2e.test_survival import CHECKPOINT_RECORD, LOCK_NAME, _cli_args, _resume_trainer
from tests.environment import REPO_ROOT, process_environment
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=3)


def _flip_byte(path: Path, at: int = 100) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([byte ^ 0xFF]))


def test_a_resave_killed_midway_leaves_no_checkpoint_that_passes_for_complete(tmp_path, tiny):
    """Issue 46, broken 1 (3 of 3): checkpoint-4/optimizer.pt has a flipped byte; resume skips it, trains to step 4
    again and re-saves it, removing the record first; a kill in the middle of that save (here: after the weights,
    in the optimizer's) left the damaged optimizer.pt, no record and the old trainer_state.json, and the next resume
    loaded it, no warning. Now the next resume skips it again and ends with the uninterrupted run's weights."""
    full = _resume_trainer(tiny, tmp_path, max_steps=4)
    full.train()
    final = {n: p.detach().clone() for n, p in full.model.named_parameters()}
    _flip_byte(tmp_path / "checkpoint-4" / "optimizer.pt")
    killed = _resume_trainer(tiny, tmp_path, max_steps=4)

    def kill(*args, **kwargs):
        raise KeyboardInterrupt  # SIGINT; a SIGKILL stops at the same point with less said

    killed._save_optimizer_and_scheduler = kill
    with pytest.warns(UserWarning, match="checkpoint-4: optimizer.pt has the recorded size but not"):
        with pytest.raises(KeyboardInterrupt):
            killed.train(resume_from_checkpoint=True)
    assert not (tmp_path / "checkpoint-4" / CHECKPOINT_RECORD).exists()
    assert (tmp_path / "checkpoint-4" / "trainer_state.json").is_file()  # the earlier save's, parsing
    resumed = _resume_trainer(tiny, tmp_path, max_steps=4)
    loaded, load = [], resumed._load_from_checkpoint
    resumed._load_from_checkpoint = lambda folder, *a, **k: loaded.append(folder) or load(folder, *a, **k)
    with pytest.warns(UserWarning, match=f"checkpoint-4: no {CHECKPOINT_RECORD}: its save was cut short"):
        resumed.train(resume_from_checkpoint=True)
    assert loaded == [str(tmp_path / "checkpoint-2")]
    for name, value in final.items():
        assert torch.equal(resumed.model.get_parameter(name).detach(), value), name


def test_rotation_keeps_the_last_complete_checkpoint_until_the_next_is_recorded(tmp_path, tiny, monkeypatch):
    """`save_total_limit=1`: transformers deletes the older checkpoints inside its save, before our record of the new
    one is written (digesting a large checkpoint takes seconds); a run killed in between kept no complete checkpoint.
    The rotation now follows the record."""
    from trl_groupopt.trainer import boundary

    record, records = boundary.write_checkpoint_record, []

    def killed_at_the_second(folder, run=None):
        records.append(folder)
        if len(records) == 2:
            raise KeyboardInterrupt
        record(folder, run)

    monkeypatch.setattr(boundary, "write_checkpoint_record", killed_at_the_second)
    trainer = _resume_trainer(tiny, tmp_path, max_steps=4)
    trainer.args.save_total_limit = 1
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.args.save_total_limit == 1
    assert (tmp_path / "checkpoint-2" / CHECKPOINT_RECORD).is_file()  # kept: still the last complete one
    monkeypatch.setattr(boundary, "write_checkpoint_record", record)
    resumed = _resume_trainer(tiny, tmp_path, max_steps=4)
    resumed.args.save_total_limit = 1
    with pytest.warns(UserWarning, match="checkpoint-4: no"):
        resumed.train(resume_from_checkpoint=True)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]  # rotated after its record


def test_cli_sigterm_after_a_checkpoint_says_how_to_resume_and_releases_the_lock(tmp_path):
    """Issue 46, weak: SIGTERM (a scheduler's stop, `kill`) exited 143 with nothing said and left the lock file,
    taken over with a warning on resume. Now it is handled as Ctrl-C: one line naming the resume command, the lock
    released, exit 143."""
    out = tmp_path / "terminated"
    command = [sys.executable, "-m", "trl_groupopt.cli", "train", "--method", "echo", *_cli_args(out)]
    run = subprocess.Popen(command, env=process_environment(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)  # fmt: skip
    record, started = out / "checkpoint-2" / CHECKPOINT_RECORD, time.perf_counter()
    while not record.exists() and run.poll() is None and time.perf_counter() - started < 300:
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    log = run.communicate(timeout=120)[0].decode(errors="replace")
    assert run.returncode == 143, log
    last = log.strip().splitlines()[-1]
    assert "Traceback" not in log and "echo: terminated (SIGTERM). Resume from the last checkpoint with:" in last
    assert last.endswith("--resume_from_checkpoint last") and not (out / LOCK_NAME).exists()
