"""The Slurm launcher of `trl-groupopt compare` (`--launcher slurm`, `pip install "trl-groupopt[slurm]"`): one job per
(method, seed), submitted through submitit as one array, re-attached to by the same command (docs/compare.md,
"On a Slurm cluster").

- DIR/slurm/jobs.jsonl: one line per submitted job (method, seed, job id, its logs, the resources asked), appended as
  soon as `sbatch` answers; DIR/slurm/jobs/: submitit's folder (the sbatch script, the pickled calls, the logs).
- A job's state, without Slurm's accounting (`sacct` needs slurmdbd): its result file (DIR/slurm/results/<id>.json,
  written by the job: `slurm_job.py`) says it finished; `squeue --states=all` says whether it is still queued or
  running; a job that has neither (cancelled, timed out, preempted, its node failed) is reported with its log and
  runs again on the next invocation.
- A record enters DIR/runs.jsonl once: the one record per job id, and never for a key already finished.
- SIGTERM or Ctrl-C stops the driver only (a submission in progress completes and is recorded first); the jobs run
  on. `--cancel` cancels the comparison's jobs."""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import runs as runfile
from . import slurm_job, slurm_pending, trainrun
from .argv import secrets_in_environment
from .report import describe

INSTALL = 'pip install "trl-groupopt[slurm]"'
#: squeue states of a job that may still finish (everything else has ended)
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
               "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}  # fmt: skip
#: seconds an ended job may take to show its result file (a shared file system's caches) before it counts as lost
RESULT_GRACE_S = 10.0
KEY = ("method", "seed")
STOP_SAYS = "the driver stops; the submitted jobs run on"  # after SIGTERM or Ctrl-C


class SubmitError(RuntimeError):
    """The cluster refused a submission (an account, a limit): one line, nothing submitted."""


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[-300:]


@dataclass
class SlurmOptions:
    """`--slurm_*`: what each job asks of the cluster. `setup`: lines run before each job (e.g. a module load)."""

    partition: str | None = None
    time: str | None = None
    gpus_per_run: int = 1
    cpus_per_run: int | None = None
    mem: str | None = None
    account: str | None = None
    setup: list[str] = field(default_factory=list)


def minutes(limit: str) -> int | None:
    """A Slurm time limit (`MINUTES`, `MINUTES:SECONDS`, `H:MM:SS`, `D-HH[:MM[:SS]]`) in whole minutes (a part of
    one counts as one); None when it is not one, or is none (0)."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", limit.strip())
    if not match:
        return None
    days, clock = match.groups()
    parts = [int(p) for p in clock.split(":")]
    if days is None:
        hours, mins, secs = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    else:
        hours, mins, secs = (parts + [0, 0])[:3]
    total = (int(days or 0) * 24 + hours) * 60 + mins + (1 if secs else 0)
    return total or None  # Slurm reads 0 as no limit at all


def partitions() -> dict[str, dict[str, Any]]:
    """`sinfo`'s partitions: name -> {"default": bool, "gpus": the most GPUs of one node}. Raises RuntimeError."""
    proc = subprocess.run(["sinfo", "-h", "-o", "%P|%G"], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["no output"])[-1])
    found: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        name, _, gres = line.partition("|")
        entry = found.setdefault(name.rstrip("*"), {"default": name.endswith("*"), "gpus": 0})
        entry["gpus"] = max(entry["gpus"], slurm_pending.gpus(gres))
    return found


def check_commands() -> str | None:
    """Why Slurm's commands cannot be run from here, or None."""
    if missing := [c for c in ("sbatch", "squeue", "sinfo", "scancel") if shutil.which(c) is None]:
        return (f"--launcher slurm: {', '.join(missing)} not on the PATH; run compare where Slurm's commands are (a "
                "login node), or add their folder to PATH.")  # fmt: skip
    return None


def check(options: SlurmOptions) -> str | None:
    """Why the cluster cannot take these jobs (one line naming the fix), asked before anything is submitted."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        return f"--launcher slurm needs submitit, which is not installed: {INSTALL}"
    if problem := check_commands():
        return problem
    if options.time is None or minutes(options.time) is None:
        given = f"--slurm_time {options.time}" if options.time is not None else "--slurm_time"
        return (f"{given}: give each job's time limit (minutes, or H:MM:SS / D-HH:MM:SS), about 1.5x one run's "
                "time (docs/compare.md, Cost).")  # fmt: skip
    if options.mem is not None and not re.fullmatch(r"\d+[KMGT]?B?", options.mem.strip(), re.IGNORECASE):
        return f"--slurm_mem {options.mem}: give a size Slurm reads, e.g. 32G or 16000M."
    try:
        known = partitions()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return f"--launcher slurm: sinfo failed ({error}); check that this machine reaches the cluster (SLURM_CONF)."
    name = options.partition or next((n for n, p in known.items() if p["default"]), None)
    if name not in known:
        wanted = f"--slurm_partition {options.partition}" if options.partition else "no --slurm_partition"
        return f"{wanted}: sinfo knows {', '.join(known) or 'no partition'}; pass --slurm_partition with one of them."
    if options.gpus_per_run > known[name]["gpus"]:
        return (f"--slurm_gpus_per_run {options.gpus_per_run}: partition {name} has nodes of at most "
                f"{known[name]['gpus']} GPU(s); pass --slurm_gpus_per_run {known[name]['gpus']} (0: train on its "
                "CPUs), or another --slurm_partition.")  # fmt: skip
    return None


def job_name(output_dir: str | Path) -> str:
    """The comparison's job name: the same for every job of DIR, different for another DIR (squeue's filter)."""
    digest = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:10]
    return f"trl-groupopt-compare-{digest}"


def queue_states(name: str) -> dict[str, str] | None:
    """job id -> state of the jobs of this name `squeue` still knows (array tasks one by one); None if it fails."""
    return slurm_pending.squeue(name, "all", "%T")


class SlurmLauncher:
    """Submits, re-attaches to and collects the jobs of one comparison folder."""

    def __init__(self, spec: trainrun.RunSpec, options: SlurmOptions, secrets: Mapping[str, str],
                 settings: dict[str, Any], command: str) -> None:  # fmt: skip
        self.spec, self.options, self.secrets = spec, options, dict(secrets)
        self.settings, self.command = settings, command
        self.dir = Path(spec.output_dir)
        self.jobs_path = self.dir / "slurm" / "jobs.jsonl"
        self.name = job_name(self.dir)
        self.grid = runfile.Grid(KEY, None, describe, trainrun.record_problem)
        self._ended_at: dict[str, float] = {}  # job id -> when this driver first saw it ended without a result
        self._progress: list = [0, 0, time.perf_counter()]  # done, total, started: the progress lines
        self._said: set[str] = set()  # the pending reasons said (`_say_stuck`)

    # ---------------------------------------------------------------------------------------------- the files
    def jobs(self) -> dict[tuple, dict[str, Any]]:
        """The latest job submitted for each key."""
        latest: dict[tuple, dict[str, Any]] = {}
        for _, entry in runfile.read_lines(self.jobs_path)[0]:  # a line cut short or damaged: skipped
            if isinstance(entry, dict) and isinstance(entry.get("job_id"), str) and not set(KEY) - entry.keys():
                latest[(entry["method"], entry["seed"])] = entry
        return latest

    def _records(self) -> dict[tuple, dict[str, Any]]:
        return {self.grid.key(r): r for r in runfile.read_runs(self.dir / "runs.jsonl", self.grid).records}

    # ---------------------------------------------------------------------------------------------- submitting
    def _executor(self) -> Any:
        import submitit

        executor = submitit.SlurmExecutor(folder=str(self.dir / "slurm" / "jobs"))
        o = self.options
        asked = {"job_name": self.name, "time": minutes(o.time or ""), "nodes": 1, "ntasks_per_node": 1,
                 "partition": o.partition, "gpus_per_node": o.gpus_per_run or None, "cpus_per_task": o.cpus_per_run,
                 "account": o.account, "setup": list(o.setup) or None}  # fmt: skip
        executor.update_parameters(**{k: v for k, v in asked.items() if v is not None})
        if o.mem is not None:
            executor.update_parameters(additional_parameters={"mem": o.mem})
        return executor

    def submit(self, keys: Sequence[tuple]) -> list[dict[str, Any]]:
        """One array job over `keys` (one job for one key); each job's line in DIR/slurm/jobs.jsonl."""
        executor = self._executor()
        calls = [(self.spec, method, seed, self.settings) for method, seed in keys]
        with secrets_in_environment(self.secrets):  # a job gets the submitter's environment
            if len(calls) == 1:
                submitted = [executor.submit(slurm_job.run_job, *calls[0])]
            else:
                submitted = executor.map_array(slurm_job.run_job, *zip(*calls))
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entries = []
        for (method, seed), job in zip(keys, submitted):
            entry = {"method": method, "seed": seed, "job_id": str(job.job_id), "submitted": now,
                     "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr), "array": len(calls) > 1,
                     "resources": dict(vars(self.options))}  # fmt: skip
            runfile.append_line(self.jobs_path, entry)
            entries.append(entry)
        return entries

    # ---------------------------------------------------------------------------------------------- collecting
    def _result(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The job's result (None: none yet); a failed run's record if the result is not a run's record."""
        path = slurm_job.results_folder(self.dir) / f"{entry['job_id']}.json"
        values, _ = runfile.read_lines(path)
        result = values[0][1] if values else None
        problem = trainrun.record_problem(result) if isinstance(result, dict) else "is not a record"
        if path.exists() and problem:
            return {**self._lost(entry, None), "error": f"Slurm job {entry['job_id']}: its result {path} {problem}"}
        return result

    def _lost(self, entry: dict[str, Any], state: str | None) -> dict[str, Any]:
        said = f"ended as {state}" if state else "is no longer known to squeue"
        error = (f"Slurm job {entry['job_id']} {said} without a result (cancelled, timed out, preempted or its node "
                 f"failed); its log: {entry['stderr']}")  # fmt: skip
        return {"method": entry["method"], "seed": entry["seed"], "error": error, "wall_s": None,
                "settings": self.settings, "slurm_job_id": entry["job_id"], "log": entry["stderr"]}  # fmt: skip

    def collect(self, keys: Sequence[tuple], states: dict[str, str]) -> tuple[list[dict[str, Any]], set[tuple]]:
        """(the records this call appended to DIR/runs.jsonl, the keys whose jobs are still live)."""
        records, jobs, live, new = self._records(), self.jobs(), set(), []
        for key in keys:
            entry, record = jobs.get(key), records.get(key)
            if entry is None or (
                record is not None and ("error" not in record or record.get("slurm_job_id") == entry["job_id"])
            ):
                continue  # never submitted, finished, or this job's record is in already
            result, state = self._result(entry), states.get(entry["job_id"])
            if result is None and state in LIVE_STATES:
                live.add(key)
                continue
            if result is None:
                first = self._ended_at.setdefault(entry["job_id"], time.monotonic())
                if time.monotonic() - first < RESULT_GRACE_S:
                    live.add(key)  # its result file may not be visible here yet
                    continue
                result = self._lost(entry, state)
            runfile.append_line(self.dir / "runs.jsonl", result)
            new.append(result)
        return new, live

    def _report(self, record: dict[str, Any]) -> None:
        """The progress line of a record just collected (`self._progress`: done, total, started)."""
        self._progress[0] += "error" not in record
        done, total, started = self._progress
        head = f"  {runfile.progress_line(done, total, time.perf_counter() - started)} {self.grid.tag(record)}"
        where = f" (job {record.get('slurm_job_id')})"
        if "error" in record:
            last = runfile.reason(record)
            log = "" if str(record.get("log")) in last else f"\n    log: {record.get('log')}"
            print(f"{head}{where}: FAILED, runs again next time: {last}{log}", flush=True)
        else:
            print(f"{head}{where}: {describe(record)}", flush=True)

    # ---------------------------------------------------------------------------------------------- the loop
    def run(self, keys: Sequence[tuple]) -> None:
        """Collect what ended, submit the keys with neither a finished run nor a live job, then collect as jobs
        finish until none of `keys` is live (or a signal stops the driver, leaving the jobs running)."""
        began, stop, collected, submitted = runfile.now(), threading.Event(), 0, 0
        finished = {k for k, r in self._records().items() if "error" not in r}
        self._progress = [sum(k in finished for k in keys), len(keys), began[0]]
        # SIGTERM and Ctrl-C: the loop ends at its next step (a submission under way completes)
        with runfile.stop_on_signals(stop, STOP_SAYS, (signal.SIGTERM, signal.SIGINT)):
            states = self._wait_for_states(stop)
            if states is None:
                return
            collected, live = self._settle(keys, states, stop)
            finished = {k for k, r in self._records().items() if "error" not in r}
            missing = [k for k in keys if k not in finished and k not in live]
            print(f"slurm: {len(live)} job(s) of this comparison live (re-attached), {len(missing)} to submit",
                  flush=True)  # fmt: skip
            if missing and not stop.is_set():
                submitted = self._submit_missing(missing)
                live |= set(missing)
            while live and not stop.is_set():
                stop.wait(min(30.0, 3.0 + 0.05 * (time.perf_counter() - began[0])))
                states = queue_states(self.name)
                if states is None:  # the controller did not answer: nothing is decided on no answer
                    continue
                new, live = self.collect(keys, states)
                collected += len(new)
                for record in new:
                    self._report(record)
                self._say_stuck()
        if live:
            print(f"slurm: {len(live)} job(s) left running; run the same command again to re-attach (it submits "
                  "only what is missing), or add --cancel to cancel them", flush=True)  # fmt: skip
        if collected or submitted:
            runfile.append_invocation(self.dir / "runs.jsonl", began, command=self.command, launcher="slurm",
                                      runs=collected, submitted=submitted)  # fmt: skip

    def _say_stuck(self) -> None:
        """Say once each reason Slurm gives for jobs that it will never start as asked (`slurm_pending`)."""
        stuck = slurm_pending.stuck(self.name, self.options)
        for said in sorted(set(stuck.values()) - self._said):
            jobs = sorted(job for job, why in stuck.items() if why == said)
            print(f"slurm: {len(jobs)} job(s) ({jobs[0]}{'..' if len(jobs) > 1 else ''}) pending and will not start: "
                  f"{said}; then run {self.command} --cancel and the same command again", flush=True)  # fmt: skip
            self._said.add(said)

    def _submit_missing(self, missing: list[tuple]) -> int:
        try:
            entries = self.submit(missing)
        except Exception as error:  # noqa: BLE001 - sbatch's refusal, said in one line
            raise SubmitError(f"sbatch refused the jobs ({_one_line(error)}); nothing was submitted: fix the "
                              "--slurm_* options and run the same command again.") from error  # fmt: skip
        ids = [e["job_id"] for e in entries]
        print(f"slurm: submitted {len(ids)} job(s) ({ids[0]}{'..' + ids[-1] if len(ids) > 1 else ''}), job name "
              f"{self.name}; logs in {self.dir / 'slurm' / 'jobs'}", flush=True)  # fmt: skip
        return len(ids)

    def _wait_for_states(self, stop: threading.Event) -> dict[str, str] | None:
        for _ in range(10):
            if (states := queue_states(self.name)) is not None:
                return states
            stop.wait(3.0)
        print("slurm: squeue did not answer; nothing submitted (run the same command again)", file=sys.stderr)
        return None

    def _settle(self, keys: Sequence[tuple], states: dict[str, str], stop: threading.Event) -> tuple[int, set]:
        """Collect what ended before this invocation, waiting out the grace of jobs ended without a result: (how
        many records it collected, the keys whose jobs are live)."""
        collected = 0
        while True:
            new, live = self.collect(keys, states)
            collected += len(new)
            for record in new:
                self._report(record)
            waiting = [k for k in live if states.get(self.jobs()[k]["job_id"]) not in LIVE_STATES]
            if not waiting or stop.is_set():
                return collected, live
            stop.wait(2.0)
            states = queue_states(self.name) or states


def cancel(output_dir: str | Path) -> list[str]:
    """Cancel the comparison's queued and running jobs (`scancel`); their ids."""
    launcher_dir = Path(output_dir)
    path = launcher_dir / "slurm" / "jobs.jsonl"
    ids = [e.get("job_id") for _, e in runfile.read_lines(path)[0] if isinstance(e, dict)]
    states = queue_states(job_name(launcher_dir)) or {}
    live = [i for i in ids if states.get(i) in LIVE_STATES]
    if live:
        subprocess.run(["scancel", *live], check=True, timeout=120)
    return live
