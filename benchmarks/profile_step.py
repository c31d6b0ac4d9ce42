"""Where a trainer's optimizer step spends more than TRL's GRPOTrainer's: torch.profiler op counts and self CPU time.

Runs the overhead benchmark's workload (`benchmarks.overhead`: same model, fake sampler, settings) once per trainer
with the timed steps under `torch.profiler`, and prints, per trainer, the ops whose calls or self CPU time per step
differ most from TRL GRPOTrainer's, plus the counts that reveal overhead on a loaded machine too: all op calls,
`aten::item` / `aten::_local_scalar_dense` (host syncs on a GPU), `aten::_to_copy` (dtype casts). Op *counts* are
exact whatever the machine's load; times are only indicative on a shared machine.

It also counts each trainer's host syncs per micro-batch (`SyncCounter`: every op that makes the host wait for a
CUDA device, e.g. `.item()`, `unique`, `nonzero`, boolean indexing, copies to the CPU), in its loss and backward,
generation excluded; a CPU run counts what a GPU run would wait for. `tests/trainers/test_host_syncs.py` uses the
same counter: no method may sync more often than TRL's GRPOTrainer, and no objective at all.

Usage (from the repo root):
    python -m benchmarks.profile_step --trainers base,echo,otb --shapes 32000x128
    python -m benchmarks.profile_step --syncs-only --shapes 0x24 --json outputs/syncs.json   # every trainer
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import common, overhead

if TYPE_CHECKING:
    from .host_syncs import SyncCounter

WATCHED = ("aten::item", "aten::_local_scalar_dense", "aten::_to_copy", "aten::copy_", "aten::nonzero")


def count_syncs(variant, sargs, device: str, dtype, tokenizer, dataset, workdir: str) -> dict[str, Any]:
    """Host syncs per micro-batch of one trainer: every `training_step` (loss, backward) of a short run, counted
    with `SyncCounter`, without `_prepare_inputs` (generation, scoring, the behaviour forward: once per generation
    batch). Returns the largest micro-batch's count, its breakdown and sites, and every micro-batch's total."""
    from .host_syncs import SyncCounter

    trainer, _, _ = overhead.build_trainer(variant, sargs, device, dtype, tokenizer, dataset, workdir)
    steps: list[SyncCounter] = []
    active: list[SyncCounter] = []
    training_step, prepare = trainer.training_step, trainer._prepare_inputs

    def counted_step(*args, **kwargs):
        with SyncCounter() as syncs:
            active.append(syncs)
            try:
                return training_step(*args, **kwargs)
            finally:
                active.pop()
                steps.append(syncs)

    def uncounted_prepare(*args, **kwargs):
        if not active:
            return prepare(*args, **kwargs)
        with active[-1].paused():
            return prepare(*args, **kwargs)

    trainer.training_step, trainer._prepare_inputs = counted_step, uncounted_prepare
    trainer.train()
    worst = max(steps, key=lambda syncs: syncs.total)
    return {
        "per_micro_batch": worst.total,
        "counts": dict(worst.counts),
        "sites": {f"{reason} at {site}": n for (reason, site), n in worst.sites.most_common()},
        "all_micro_batches": [syncs.total for syncs in steps],
    }


def print_syncs(syncs: dict[str, dict]) -> None:
    """The per-trainer table of host syncs per micro-batch, against TRL's GRPOTrainer."""
    base = syncs[overhead.BASELINE]["per_micro_batch"]
    rows = [
        [name, str(entry["per_micro_batch"]), f"{entry['per_micro_batch'] - base:+d}",
         ", ".join(f"{reason} {n}" for reason, n in sorted(entry["counts"].items()))]
        for name, entry in syncs.items()
    ]  # fmt: skip
    print("\nHost syncs per micro-batch (loss + backward; a CPU trace counts what a CUDA run waits for):")
    common.print_table(["trainer", "syncs", "vs TRL", "ops"], rows)


def _op_table(record: dict) -> dict[str, Any]:
    steps = len(record["step_s"])
    return {
        "time_ms": overhead.repeat_time_ms(record),
        "ops": {
            k: {"count": v["count"] / steps, "self_ms": v["self_cpu_us"] / 1e3 / steps}
            for k, v in record["ops"].items()
        },
    }


def print_ops(tables: dict[str, dict], top: int) -> None:
    """Per trainer: op calls and self CPU time per step against TRL GRPOTrainer's, the largest differences first."""
    base = tables[overhead.BASELINE]
    for name, table in tables.items():
        ops = table["ops"]
        calls = sum(v["count"] for k, v in ops.items() if k.startswith("aten::"))
        base_calls = sum(v["count"] for k, v in base["ops"].items() if k.startswith("aten::"))
        watched = ", ".join(f"{k.split('::')[1]} {ops.get(k, {}).get('count', 0):.0f}"
                            f" ({ops.get(k, {}).get('count', 0) - base['ops'].get(k, {}).get('count', 0):+.0f})"
                            for k in WATCHED)  # fmt: skip
        print(f"\n== {name}: {table['time_ms']:.1f} ms/step ({table['time_ms'] / base['time_ms']:.3f}x, indicative); "
              f"aten calls/step {calls:.0f} ({calls - base_calls:+.0f}); {watched}", flush=True)  # fmt: skip
        if name == overhead.BASELINE:
            continue
        diffs = []
        for k in set(ops) | set(base["ops"]):
            a, b = ops.get(k, {"count": 0, "self_ms": 0}), base["ops"].get(k, {"count": 0, "self_ms": 0})
            diffs.append((a["self_ms"] - b["self_ms"], a["count"] - b["count"], k, a["self_ms"], b["self_ms"]))
        diffs.sort(key=lambda d: -abs(d[0]))
        rows = [[k[:60], f"{dc:+.0f}", f"{dt:+.2f}", f"{a:.2f}", f"{b:.2f}"] for dt, dc, k, a, b in diffs[:top]]
        common.print_table(["op", "calls/step vs TRL", "self ms/step vs TRL", "self ms", "TRL self ms"], rows)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=12, help="Ops listed per trainer.")
    parser.add_argument("--json", type=Path, help="Also write the per-trainer op and sync tables here.")
    parser.add_argument("--syncs-only", action="store_true", help="Count host syncs only (no torch.profiler runs).")
    own, rest = parser.parse_known_args(argv)
    args = overhead.parse_args(["--device", "cpu", "--repeats", "1", *rest])
    common.setup_environment()
    device = common.resolve_device("cpu")

    import torch

    from trl_groupopt.offline import build_tokenizer

    dtype = torch.float32
    tokenizer = build_tokenizer()
    chosen = overhead.variants()
    if args.trainers:
        wanted = {t.strip() for t in args.trainers.split(",")} | {overhead.BASELINE}
        chosen = [v for v in chosen if v.name in wanted]
    chosen = [v for v in chosen if v.name != overhead.CONTROL]  # the A/A control is the baseline again
    vocab, length = args.shape_list[0]
    sargs = argparse.Namespace(**{**vars(args), "vocab_size": vocab or None, "completion_length": length})
    chosen = [v for v in chosen if overhead.availability(v, sargs, device, dtype) is None]
    dataset = overhead.make_prompts(64, args.prompt_length, args.seed)
    tables: dict[str, dict] = {}
    syncs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="profile-") as workdir:
        for variant in chosen:
            syncs[variant.name] = count_syncs(variant, sargs, device, dtype, tokenizer, dataset, workdir)
            if not own.syncs_only:
                (record,) = overhead.run_trainers([variant], sargs, device, dtype, tokenizer, dataset, workdir,
                                                  profile=True).values()  # fmt: skip
                tables[variant.name] = _op_table(record)
    if tables:
        print_ops(tables, own.top)
    print_syncs(syncs)
    if own.json:
        payload = {"benchmark": "profile_step", "command": common.command_line("benchmarks.profile_step", argv)
                   if argv is not None else common.command_line(), "device": common.describe_device(device),
                   "shape": overhead.shape_key(vocab, length), "tables": tables, "syncs": syncs}  # fmt: skip
        common.write_json(own.json, payload)
    return {"tables": tables, "syncs": syncs}


if __name__ == "__main__":
    main()
