"""The overhead benchmark's lockstep runs: every trainer of a run in its own thread, one optimizer step per turn
(`Lockstep`), each step timed (`step_timer`, `step_clock`), and which variants share a run (`lockstep_groups`)."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from .overhead_workload import BASELINE, CONTROL, Variant, build_trainer


class Lockstep:
    """Turns for the trainers' threads: one at a time, one optimizer step per turn, in `order`, rotated by one after
    every round (not reversed: that lets the end trainers run two steps in a row, the second with warm caches,
    measured as a 3-5% bias between identical trainers); a ready flag per trainer, the device, the warm-up steps."""

    def __init__(self, names: list[str], on_round=None, device: str = "cpu", warmup: int = 0):
        self.order, self.pos, self.started, self.on_round = list(names), 0, False, on_round
        self.ready = {name: threading.Event() for name in names}
        self.device, self.warmup = device, warmup
        self.cond = threading.Condition()

    def start(self) -> None:
        with self.cond:
            self.started = True
            self.cond.notify_all()

    def acquire(self, name: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.started and self.order[self.pos] == name)

    def release(self, name: str) -> None:
        with self.cond:
            self.pos += 1
            self._wrap()

    def leave(self, name: str) -> None:
        """`name` takes no more turns (its training ended, or failed): the others go on without it."""
        with self.cond:
            if name in self.order:
                self.pos -= self.order.index(name) < self.pos
                self.order.remove(name)
                self._wrap()

    def _wrap(self) -> None:
        if self.order and self.pos >= len(self.order):
            self.pos, self.order = 0, self.order[1:] + self.order[:1]
            if self.on_round is not None:
                self.on_round()  # between rounds: no trainer is inside a step
        self.cond.notify_all()


def run_trainers(variants: list[Variant], args, device: str, dtype, tokenizer, dataset, workdir: str) -> dict:
    """Train the variants for warmup + steps optimizer steps in lockstep; per trainer `step_s` per timed step and,
    on CUDA, the activation peak."""
    import torch

    built = {v.name: build_trainer(v, args, device, dtype, tokenizer, dataset, workdir) for v in variants}
    records = {name: {"step_s": [], "activation_peak_bytes": None} for name in built}
    turns = Lockstep(list(built), lambda: gc.collect(1), device, args.warmup)  # young objects: fast
    for name, trainer in built.items():
        trainer.add_callback(step_timer(turns, name, records[name]))
    train_in_lockstep(built, turns)
    for name, trainer in built.items():
        buffered = trainer._buffered_inputs[0] if trainer._buffered_inputs else {}
        records[name].update(off_policy=buffered.get("old_per_token_logps") is not None,
                             otb_energy_from_behaviour_forward="old_per_token_energy" in buffered,
                             num_parameters=sum(p.numel() for p in trainer.model.parameters()))  # fmt: skip
    del built, trainer  # the trainers and their callbacks form cycles: gc.collect() frees them
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return records


def step_timer(turns: Lockstep, name: str, record: dict):
    """The callback that times each optimizer step of `name` into `record` and takes one lockstep turn per step."""
    import torch
    from transformers import TrainerCallback

    cuda = turns.device == "cuda"
    clock = step_clock(turns.device)

    class StepTimer(TrainerCallback):
        def on_train_begin(self, _args, state, control, **kwargs):
            turns.ready[name].set()
            turns.acquire(name)  # from here on this thread runs only in its turns

        def on_step_begin(self, _args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                self.start_bytes = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            self.t0 = clock()

        def on_step_end(self, _args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            elapsed = clock() - self.t0
            if state.global_step > turns.warmup:
                record["step_s"].append(elapsed)
                if cuda:
                    peak = torch.cuda.max_memory_allocated() - self.start_bytes
                    record["activation_peak_bytes"] = max(record["activation_peak_bytes"] or 0, peak)
            if state.global_step < state.max_steps:  # the last turn ends when train() returns (train_in_lockstep)
                turns.release(name)
                turns.acquire(name)

    return StepTimer()


def step_clock(device: str):
    """Wall time on CUDA (a host sync's stall is the cost), this thread's CPU time on a CPU: with one torch thread
    the step runs in the trainer's thread, and CPU time leaves out what other processes of a shared machine take."""
    return time.perf_counter if device == "cuda" else time.thread_time


def train_in_lockstep(trainers: dict[str, Any], turns: Lockstep) -> None:
    """Train every trainer in its own thread, one step per turn, garbage collection between rounds only; re-raises
    the first failure here."""
    errors: dict[str, BaseException] = {}

    def train(name: str, trainer) -> None:
        try:
            trainer.train()
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread below
            errors[name] = error
            turns.ready[name].set()
        finally:
            turns.leave(name)

    gc.collect()
    gc.disable()
    try:
        threads = []
        for name, trainer in trainers.items():
            threads.append(threading.Thread(target=train, args=(name, trainer), name=f"overhead-{name}", daemon=True))
            threads[-1].start()
            turns.ready[name].wait()  # set-ups one at a time
        turns.start()
        for thread in threads:
            thread.join()
    finally:
        gc.enable()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"trainer {name!r} failed in the overhead benchmark") from error


def lockstep_groups(order: list[Variant], group_size: int) -> list[list[Variant]]:
    """The runs of one repeat, each with the baseline and the control, in `order`: the others grouped by method (a
    variant always runs with its method's default), methods packed first-fit by decreasing size into runs of
    `group_size` (a larger method gets a run of its own; 0: everything in one run)."""
    families: dict[str, list[Variant]] = {}
    for v in order:
        if v.name not in (BASELINE, CONTROL):
            families.setdefault(v.method or v.name, []).append(v)
    runs: list[list[Variant]] = []
    for family in sorted(families.values(), key=len, reverse=True):
        run = next((r for r in runs if not group_size or len(r) + len(family) <= group_size), None)
        if run is None:
            runs.append(run := [])
        run += family
    return [[v for v in order if v.name in (BASELINE, CONTROL) or v in run] for run in runs or [[]]]
