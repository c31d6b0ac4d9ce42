"""One (method, seed) of a comparison: `python -m trl_groupopt.cli train ...` in a process of its own (`accelerate
launch --num_processes N` for a run of N devices), scored where compare scores it, and its record. Plain data in and
out: the local launcher (`local.py`) calls it in a thread, a Slurm job (`slurm_job.py`) on its node."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .argv import scan

#: the launcher of a run of several processes
ACCELERATE = ("-m", "accelerate.commands.launch")


@dataclass(frozen=True)
class RunSpec:
    """What every run of a comparison shares. A Slurm job pickles it to disk: it never holds a secret (those reach a
    run through its environment only, `secrets.py`)."""

    output_dir: str
    run_args: tuple[str, ...]
    score_here: bool  # compare scores DIR/data/heldout.jsonl itself (a user's dataset or model)
    eval_examples: int
    processes: int = 1  # training processes per run, one per GPU: `accelerate launch --multi_gpu` when > 1
    one_thread: bool = False  # runs share the CPU: one torch thread each

    def folder(self, method: str, seed: int) -> Path:
        return Path(self.output_dir) / "runs" / f"{method}-{seed}"

    def command(self, method: str, seed: int, port: int | None = None) -> list[str]:
        """The run's command line: the train command, under `accelerate launch` for several processes."""
        train = ["train", "--method", method, "--seed", str(seed), "--output_dir", str(self.folder(method, seed)),
                 "--heldout_eval_steps", "0", *self.run_args]  # fmt: skip
        if self.processes == 1:
            return [sys.executable, "-m", "trl_groupopt.cli", *train]
        launch = ["--multi_gpu", "--num_processes", str(self.processes), "--num_machines", "1",
                  "--main_process_port", str(port or 0)]  # fmt: skip
        return [sys.executable, *ACCELERATE, *launch, "--module", "trl_groupopt.cli", *train]

    def max_new_tokens(self) -> int:
        return int(scan(self.run_args, "max_completion_length")[0]["max_completion_length"] or 256)  # TRL's default

    def base_model(self) -> str:
        from ..data.offline import EMBEDDED_POLICY_PATH

        return scan(self.run_args, "model_name_or_path")[0]["model_name_or_path"] or str(EMBEDDED_POLICY_PATH)


def free_port() -> int:
    """A port free on this host now (for a run's `--main_process_port`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_env(spec: RunSpec, devices: Sequence[str] | None, extra: Mapping[str, str] = ()) -> dict[str, str]:
    """A run's environment: this process's, `extra` (secrets), its devices pinned, one thread where runs share a CPU."""
    env = {**os.environ, **dict(extra)}
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if spec.one_thread:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["?"]
    return lines[0][-300:]


def launch(command: list[str], log: Path, env: Mapping[str, str],
           track: Callable[[subprocess.Popen | None], None] | None = None) -> tuple[float, float]:  # fmt: skip
    """Run `command` with its output in `log`; (wall, CPU seconds). `track(proc)` is told the process while it runs,
    then None. A session of its own: SIGTERM to the driver's terminal group leaves it running. Raises RuntimeError
    naming the log on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )
        if track is not None:
            track(proc)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        finally:
            if proc.returncode is None:  # interrupted (a job's timeout): the run must not outlive its caller
                proc.kill()
                proc.wait()
            if track is not None:
                track(None)
    if proc.returncode:
        raise RuntimeError(f"exit status {proc.returncode}; {log}: {_last_line(log)}")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def score(spec: RunSpec, model: str, device: str | None) -> float:
    """Greedy held-out accuracy of `model` on DIR/data/heldout.jsonl, on `device` (None: CUDA where there is one)."""
    heldout = Path(spec.output_dir) / "data" / "heldout.jsonl"
    return heldout_accuracy(model, heldout, spec.max_new_tokens(), device)["accuracy"]


def run_one(spec: RunSpec, method: str, seed: int, env: Mapping[str, str], *,
            before: Callable[[], float] | None = None, track: Callable[[subprocess.Popen | None], None] | None = None,
            device: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Train (method, seed) afresh and return its record: held-out accuracy before and after, how often the mechanism
    acted, wall and CPU time, when it ran, on which devices and host. Where compare scores, it does so here on
    `device` (the run's own); `before()` gives the starting model's accuracy (measured once by the caller), else
    the run measures it."""
    folder = spec.folder(method, seed)
    shutil.rmtree(folder, ignore_errors=True)  # not a finished run (those are skipped): start it afresh
    started = time.time()
    port = free_port() if spec.processes > 1 else None
    wall, cpu = launch(spec.command(method, seed, port), folder.with_suffix(".log"), env, track)
    results = json.loads((folder / "results.json").read_text())
    accuracy_before, accuracy_after = results.get("accuracy_before"), results.get("accuracy_after")
    if spec.score_here:
        accuracy_after = score(spec, str(folder), device)
        accuracy_before = before() if before is not None else score(spec, spec.base_model(), device)
    mechanisms = (results.get("mechanism") or {}).get("mechanisms") or []
    acted = {"what": "; ".join(m["acted_means"] for m in mechanisms), "steps": sum(m["steps"] for m in mechanisms),
             "acted": sum(m["acted"] for m in mechanisms)} if mechanisms else None  # fmt: skip
    devices = env.get("CUDA_VISIBLE_DEVICES")
    return {"method": method, "seed": seed, "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
            "heldout_examples": spec.eval_examples, "steps": results.get("steps"), "acted": acted, "wall_s": wall,
            "cpu_s": cpu, "output_dir": str(folder), "devices": devices.split(",") if devices else None,
            "start_time": started, "end_time": time.time(), "host": socket.gethostname()}  # fmt: skip


def heldout_accuracy(model_path: str, heldout_path: Path, max_new_tokens: int,
                     device: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Greedy accuracy of a saved model (or a Hub id) on the carved held-out rows (`offline.greedy_accuracy`), on
    `device` (None: CUDA where there is one)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data.adapters import string_prompt_to_conversational
    from ..data.offline import greedy_accuracy

    heldout = datasets.load_dataset("json", data_files=str(heldout_path), split="train")
    if isinstance(heldout[0]["prompt"], str):  # greedy_accuracy renders conversational prompts
        heldout = heldout.map(string_prompt_to_conversational)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return greedy_accuracy(model, tokenizer, heldout, max_new_tokens=max_new_tokens)
