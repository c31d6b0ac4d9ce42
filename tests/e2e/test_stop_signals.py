"""Issue 52, broken 2: a stop signal is never lost. The handler raised `Interrupted` where the signal landed and set
SIGINT and SIGTERM to ignored first; landing in a `__del__` or a weakref callback, the exception was dropped ("Exception
ignored in ...") and the run trained on to exit 0 with every later signal ignored. The signal is raised here from
inside such code during the demo's training (deterministic: `signal.raise_signal` runs the handler at once), once a
checkpoint is complete: the run stops at the step's end with the resume command, exit 143; a second signal acts."""

from __future__ import annotations

import signal
import sys
import weakref

import pytest

from tests.e2e.test_survival import CHECKPOINT_RECORD, LOCK_NAME, _cli_args
from trl_groupopt.cli import main as cli
from trl_groupopt.cli import script


class _SignalWhenDropped:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)


class _Target:
    pass


def _drop_a_signal(where: str, keep: list) -> None:
    """Raise SIGTERM from inside a `__del__` or a weakref callback, where Python drops the handler's exception."""
    if where == "__del__":
        _SignalWhenDropped()
        return
    target = _Target()
    keep.append(weakref.ref(target, lambda ref: signal.raise_signal(signal.SIGTERM)))
    del target


def _train(tmp_path, capsys, monkeypatch, where: str, then_sigint: bool = False):
    """(exit status or None if the command returned, stderr, the dropped exceptions) of the demo run, its signal
    dropped at the first reward computed once checkpoint-2 is complete."""
    out, dropped, keep = tmp_path / "out", [], []
    reward = script.REWARD_FUNCS["accuracy_reward"]

    def signalling_reward(*args, **kwargs):
        if (out / "checkpoint-2" / CHECKPOINT_RECORD).exists() and not keep and not dropped:
            _drop_a_signal(where, keep)
            keep.append(None)
            if then_sigint:
                signal.raise_signal(signal.SIGINT)  # the second signal: ignored before, it must act now
        return reward(*args, **kwargs)

    monkeypatch.setitem(script.REWARD_FUNCS, "accuracy_reward", signalling_reward)
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_value))
    capsys.readouterr()
    try:
        cli.main(["train", "--method", "echo", *_cli_args(out, "--max_steps", "6")])
        status = None
    except SystemExit as exited:
        status = exited.code
    return out, status, capsys.readouterr().err, dropped


@pytest.mark.parametrize("where", ["__del__", "weakref callback"])
def test_a_signal_landing_where_python_drops_its_exception_still_stops_the_run(tmp_path, capsys, monkeypatch, where):
    out, status, err, dropped = _train(tmp_path, capsys, monkeypatch, where)
    assert [type(e).__name__ for e in dropped] == ["Interrupted"]  # it did land where the exception is dropped
    assert status == 143, err
    last = err.strip().splitlines()[-1]
    assert "echo: terminated (SIGTERM). Resume from the last checkpoint with:" in last
    assert last.endswith("--resume_from_checkpoint last")
    assert not (out / "model.safetensors").exists() and not (out / "checkpoint-6").exists()
    assert not (out / LOCK_NAME).exists()
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # the command's handlers are put back


def test_a_second_signal_after_a_dropped_one_acts(tmp_path, capsys, monkeypatch):
    out, status, err, dropped = _train(tmp_path, capsys, monkeypatch, "__del__", then_sigint=True)
    assert len(dropped) == 1 and status == 130, err
    assert "echo: interrupted. Resume from the last checkpoint with:" in err.strip().splitlines()[-1]
    assert not (out / "model.safetensors").exists()
