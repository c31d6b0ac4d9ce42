"""Jobs of a comparison that Slurm keeps pending for a reason that will not clear by itself (`squeue`'s reason): said
once, with the fix, instead of waiting in silence (docs/compare.md, "On a Slurm cluster")."""

from __future__ import annotations

import re
import subprocess
from typing import Any

#: squeue reasons that no amount of waiting clears: the request does not fit the partition, its nodes or the account
NEVER_CLEAR = {
    "PartitionConfig": "the request does not fit partition {partition}'s limits",
    "PartitionNodeLimit": "the request asks more nodes than partition {partition} allows",
    "PartitionTimeLimit": "--slurm_time is longer than partition {partition} allows",
    "BadConstraints": "no node of partition {partition} has what the job asks",
    "ReqNodeNotAvail": "the nodes the job needs are not available (down, drained or reserved)",
    "InvalidAccount": "--slurm_account is not an account of yours on this cluster",
    "InvalidQOS": "the job's QOS is not valid for its account or partition",
    "PartitionDown": "partition {partition} is down",
    "PartitionInactive": "partition {partition} is inactive",
}


def query(command: list[str], timeout: float = 120) -> list[str] | None:
    """The output lines of a Slurm query (`squeue`, `sinfo`); None when it fails or does not answer in time."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if proc.returncode else proc.stdout.splitlines()


def squeue(name: str, states: str, column: str) -> dict[str, str] | None:
    """job id -> squeue's `column` (`%T` state, `%r` reason) of the jobs of job name `name` in `states` (array tasks
    one by one); None when squeue fails."""
    lines = query(["squeue", "-h", "-r", f"--states={states}", "--name", name, "-o", f"%i|{column}"])
    return None if lines is None else dict(line.strip().split("|", 1) for line in lines if "|" in line)


def gpus(gres: str) -> int:
    """The most GPUs of one node in sinfo's `%G` (generic resources, e.g. `gpu:a100:4(S:0-1)`); 0 without any."""
    return max([0, *(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))])


def nodes(partition: str | None) -> dict[str, int]:
    """The most CPUs, memory (MB) and GPUs of one node of `partition` (the default one when None), from `sinfo`;
    empty when it does not answer."""
    lines = query(["sinfo", "-h", "-o", "%c|%m|%G", *(["-p", partition] if partition else [])], timeout=60)
    if lines is None:
        return {}
    most = {"cpus": 0, "mem": 0, "gpus": 0}
    for line in lines:
        cpus, _, rest = line.partition("|")
        mem, _, gres = rest.partition("|")
        for name, value in (("cpus", cpus), ("mem", mem.rstrip("+")), ("gpus", str(gpus(gres)))):
            if value.strip().isdigit():
                most[name] = max(most[name], int(value))
    return most


def _megabytes(size: str) -> int | None:
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", size.strip(), re.IGNORECASE)
    if not match:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
    return int(int(match.group(1)) * scale)


def too_large(options: Any, most: dict[str, int]) -> str | None:
    """What of the request (`SlurmOptions`) no node of the partition has (`nodes`), with the fix; or None."""
    asked = [("cpus", options.cpus_per_run, "--slurm_cpus_per_run", "CPUs"),
             ("mem", _megabytes(options.mem) if options.mem else None, "--slurm_mem", "MB of memory"),
             ("gpus", options.gpus_per_run or None, "--slurm_gpus_per_run", "GPUs")]  # fmt: skip
    for name, value, option, unit in asked:
        if value is not None and most.get(name) and value > most[name]:
            return f"each job asks {option} {value} {unit}, its partition's nodes have at most {most[name]}"
    return None


def problem(reason: str, options: Any, most: dict[str, int]) -> str | None:
    """Why a job pending for `reason` (squeue's `%r`) will not start, and the fix; None for a reason that clears
    (`Priority`, `Resources` that a node has, ...)."""
    reason = reason.strip().split(",")[0].strip("()")
    partition = options.partition or "(default)"
    if reason == "Resources" or reason in NEVER_CLEAR:
        if larger := too_large(options, most):
            return f"squeue reason {reason}: {larger}: lower it"
    if reason in NEVER_CLEAR:
        return f"squeue reason {reason}: {NEVER_CLEAR[reason].format(partition=partition)}: fix the --slurm_* options"
    return None


def stuck(name: str, options: Any) -> dict[str, str]:
    """job id -> why it will not start (with the fix), for the pending jobs of job name `name` that will not."""
    pending = squeue(name, "PENDING", "%r")
    if not pending:
        return {}
    most = nodes(options.partition)
    found = {job: problem(reason, options, most) for job, reason in pending.items()}
    return {job: said for job, said in found.items() if said}
