"""The command's stop signals (Ctrl-C, SIGTERM): a signal always ends the run, with the line saying what to run next
(`trl_groupopt.cli.main.one_line_errors`). The handler raises `Interrupted` where the signal lands; where Python
drops that exception (a signal landing in a `__del__` or a weakref callback: "Exception ignored in ..."), the signal
is still pending and the next safe point raises it (`raise_pending`: each training step's end, the data checks).
The handler stays armed until the command is stopping, so a further signal acts too. No TRL import."""

from __future__ import annotations

import signal
import threading
from typing import Any, NoReturn

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: signals received by the command and not yet acted on (cleared by `arm` and `disarm`)
_pending: list[int] = []


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM, `signum`, during the command."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: Any) -> NoReturn:
    _pending.append(signum)  # first: the raise below may be dropped where it lands
    raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def arm() -> dict[int, Any]:
    """Install the handler for SIGINT and SIGTERM (the main thread only); returns the handlers it replaced."""
    _pending.clear()
    return {each: signal.signal(each, _stop) for each in SIGNALS} if _main_thread() else {}


def disarm(handlers: dict[int, Any]) -> None:
    """Put back the handlers `arm` replaced; forget any pending signal."""
    for each, handler in handlers.items():
        signal.signal(each, handler)
    _pending.clear()


def ignore() -> None:
    """The command is stopping (its lock, folder and progress bar winding down): further signals are ignored."""
    if _main_thread():
        for each in SIGNALS:
            signal.signal(each, signal.SIG_IGN)


def raise_pending() -> None:
    """At a safe point: raise the stop a signal asked for if its exception was dropped where it landed."""
    if _pending:
        raise Interrupted(_pending[0])


def safe_points() -> Any:
    """A `TrainerCallback` that calls `raise_pending` at the end of every training step and micro-step."""
    from transformers import TrainerCallback

    class StopAtSafePoints(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise_pending()

        def on_substep_end(self, args, state, control, **kwargs):
            raise_pending()

    return StopAtSafePoints()
