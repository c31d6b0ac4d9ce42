"""Opening a run (`open_run`): the one place that takes the run's lock and decides what the run is (fresh,
resumed, its training complete, finished), once per run and before anything loads. The command line opens the run
before the model loads and hands it to the trainer (`GroupOptTrainer.opened_run`); `GroupOptTrainer.train()` opens
it itself when nobody did (the Python API). docs/reliability.md, "Runs that survive"."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import resume
from .checkpoints import FINAL_RECORD, checkpoints, remove_record
from .lock import RunLock


@dataclass
class OpenedRun:
    """What `open_run` decided (`resume.decide`), valid while its lock is held."""

    args: Any
    cli: bool  # the command line: messages name its flags; it writes (and records) the final outputs
    main: bool  # the main process (which holds the lock and deletes)
    checkpoint: str | None  # the checkpoint to resume from; None: a fresh run
    done: str | None  # the line saying `checkpoint` is at the run's last step: nothing is trained
    finished: bool  # the command line's final outputs are complete too: nothing at all is left to do

    def begin(self) -> None:
        """Training is about to start: a fresh `--overwrite_output_dir` run deletes the earlier run's checkpoints
        and the record of its final outputs now, not earlier (a run that fails to load its model loses nothing)."""
        if self.cli and self.main and self.checkpoint is None and getattr(self.args, "overwrite_output_dir", False):
            remove_record(self.args.output_dir, FINAL_RECORD)
            for folder in checkpoints(self.args.output_dir):
                shutil.rmtree(folder)


@contextlib.contextmanager
def open_run(args: Any, method: str, resume_from_checkpoint: str | bool | None, *, cli: bool = False
             ) -> Iterator[OpenedRun]:  # fmt: skip
    """Within it, the run into `args.output_dir` holds its lock (the main process) and the resume rules have decided
    what it is; raises (`OutputFolderInUseError`, `ValueError` naming the fix) when it may not go on."""
    main = getattr(args, "process_index", 0) == 0
    with RunLock(args.output_dir, enabled=main):
        yield OpenedRun(args, cli, main, *resume.decide(args, method, resume_from_checkpoint, cli=cli))
