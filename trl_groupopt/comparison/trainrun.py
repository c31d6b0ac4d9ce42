"""One (method, seed) of a comparison, run inside its job (a process of its own: `local.run_job` under submitit's
LocalExecutor, `slurm_job.run_job` under its SlurmExecutor): `python -m trl_groupopt.cli train ...` in a process
of its own (`accelerate launch --num_processes N` for a run of N devices), scored in the job, and its record. Plain
data in and out. The comparison's driver never loads a model: every scoring happens here, in a job."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .argv import scan
from .process import launch
from .runs import write_json

#: the launcher of a run of several processes
ACCELERATE = ("-m", "accelerate.commands.launch")
#: seconds a run waits for its folder's lock (a job of an earlier invocation still stopping) before it fails
LOCK_WAIT_S = 120.0
#: DIR/data/<this>: the starting model's held-out accuracy, measured by the first job that needs it
BASE_ACCURACY = "base_accuracy.json"


@dataclass(frozen=True)
class RunSpec:
    """What every run of a comparison shares. A Slurm job pickles it to disk: it never holds a secret (those reach a
    run through its environment only, `argv.take_secrets`)."""

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


def score(spec: RunSpec, model: str, device: str | None) -> float:
    """Greedy held-out accuracy of `model` on DIR/data/heldout.jsonl, on `device` (None: CUDA where there is one)."""
    heldout = Path(spec.output_dir) / "data" / "heldout.jsonl"
    mode = scan(spec.run_args, "string_prompts")[0]["string_prompts"] or "user_message"
    return heldout_accuracy(model, heldout, spec.max_new_tokens(), device, mode)["accuracy"]


def base_accuracy(spec: RunSpec, device: str | None) -> float:
    """The starting model's held-out accuracy: measured by the first job that needs it (the others wait on its
    lock) and kept in DIR/data/base_accuracy.json, with what it was measured on (the model, the held-out file's
    digest, the generation length and prompt mode): another of these measures it again."""
    import filelock

    from ..runfolder.checkpoints import file_digest, read_json

    path = Path(spec.output_dir) / "data" / BASE_ACCURACY
    mode = scan(spec.run_args, "string_prompts")[0]["string_prompts"] or "user_message"
    key = {"model": spec.base_model(), "heldout_sha256": file_digest(path.with_name("heldout.jsonl")),
           "max_new_tokens": spec.max_new_tokens(), "string_prompts": mode}  # fmt: skip
    with filelock.FileLock(str(path.with_suffix(".lock"))):
        kept = read_json(path)
        if isinstance(kept, dict) and kept.get("measured_on") == key and isinstance(kept.get("accuracy"), float):
            return kept["accuracy"]
        accuracy = score(spec, spec.base_model(), device)
        write_json(path, {"measured_on": key, "accuracy": accuracy})
    return accuracy


def run_one(spec: RunSpec, method: str, seed: int, env: Mapping[str, str], *,
            before: Callable[[], float] | None = None, device: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Train (method, seed) afresh and return its record: held-out accuracy before and after, how often the mechanism
    acted, wall and CPU time, when it ran, on which devices and host. Where compare scores, it does so here on
    `device` (the run's own); `before()` gives the starting model's accuracy, else `base_accuracy`. The run holds
    DIR/runs/M-S.lock (the kernel drops it with its process) while it trains into its folder: a job of an earlier
    invocation still stopping is waited for, never signalled, and a run never trains twice into one folder."""
    import filelock

    folder = spec.folder(method, seed)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        held = filelock.FileLock(str(folder.with_suffix(".lock")), timeout=LOCK_WAIT_S).acquire()
    except filelock.Timeout:
        raise RuntimeError(f"{folder}: another process has trained into it for {LOCK_WAIT_S:.0f} s (a comparison "
                           "on the same --output_dir?): let it end, or use another --output_dir") from None  # fmt: skip
    with held:
        shutil.rmtree(folder, ignore_errors=True)  # not a finished run (those are skipped): start it afresh
        started = time.time()
        port = free_port() if spec.processes > 1 else None
        wall, cpu = launch(spec.command(method, seed, port), folder.with_suffix(".log"), env)
    results = json.loads((folder / "results.json").read_text())
    accuracy_before, accuracy_after = results.get("accuracy_before"), results.get("accuracy_after")
    if spec.score_here:
        accuracy_after = score(spec, str(folder), device)
        accuracy_before = before() if before is not None else base_accuracy(spec, device)
    mechanisms = (results.get("mechanism") or {}).get("mechanisms") or []
    acted = {"what": "; ".join(m["acted_means"] for m in mechanisms), "steps": sum(m["steps"] for m in mechanisms),
             "acted": sum(m["acted"] for m in mechanisms),
             "undefined": sum(m.get("undefined", 0) for m in mechanisms)} if mechanisms else None  # fmt: skip
    devices = env.get("CUDA_VISIBLE_DEVICES")
    return {"method": method, "seed": seed, "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
            "heldout_examples": spec.eval_examples, "steps": results.get("steps"), "acted": acted,
            "no_signal_steps": results.get("no_signal_steps"), "wall_s": wall,
            "cpu_s": cpu, "output_dir": str(folder), "devices": devices.split(",") if devices else None,
            "start_time": started, "end_time": time.time(), "host": socket.gethostname()}  # fmt: skip


def record_problem(record: dict[str, Any]) -> str | None:
    """Why a line of DIR/runs.jsonl is not a run's record compare can use (`runs.Grid.check`), or None."""
    if not isinstance(record.get("method"), str) or type(record.get("seed")) is not int or record["seed"] < 0:
        return "has no method and seed"
    if not isinstance(record.get("settings", {}), dict):
        return "has settings that are not an object"
    if "error" in record:
        return None
    numbers = [record.get(k, "") for k in ("accuracy_before", "accuracy_after", "wall_s", "cpu_s")]
    if not all(v is None or type(v) in (int, float) for v in numbers) or None in numbers[2:]:
        return "has no accuracy, wall or CPU time"
    if not all(v is None or math.isfinite(v) for v in numbers):  # NaN would count as a measured run
        return "has an accuracy or time that is not a number (NaN or infinite)"
    acted = record.get("acted")
    if acted is not None and not (isinstance(acted, dict) and all(type(acted.get(k)) is int for k in
                                                                   ("steps", "acted"))):  # fmt: skip
        return "has a mechanism count that is not one"
    return None


_PREPARED: dict[tuple, Any] = {}  # (file, its version, the template, --string_prompts) -> the held-out rows


def _heldout(path: Path, tokenizer: Any, mode: str) -> Any:
    """DIR/data/heldout.jsonl as train sends its prompts (`adapters.prepare_prompts`: plain strings as one user
    message for a chat template, unless `--string_prompts raw`), prepared (and said) once per file and template."""
    import datasets

    from ..data.adapters import prepare_prompts

    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, tokenizer.chat_template, *tokenizer.all_special_tokens, mode)
    if key not in _PREPARED:
        heldout = datasets.load_dataset("json", data_files=str(path), split="train")
        _PREPARED[key] = prepare_prompts(heldout, str(path), tokenizer, mode)
    return _PREPARED[key]


def heldout_accuracy(model_path: str, heldout_path: Path, max_new_tokens: int, device: str | None = None,
                     string_prompts: str = "user_message") -> dict[str, Any]:  # fmt: skip
    """Greedy accuracy of a saved model (or a Hub id) on the carved held-out rows (`offline.greedy_accuracy`), on
    `device` (None: CUDA where there is one), its prompts sent as the runs' were (`--string_prompts`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data.offline import greedy_accuracy

    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    heldout = _heldout(Path(heldout_path), tokenizer, string_prompts)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return greedy_accuracy(model, tokenizer, heldout, max_new_tokens=max_new_tokens)
