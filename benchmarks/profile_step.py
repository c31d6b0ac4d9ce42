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
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import common, overhead

WATCHED = ("aten::item", "aten::_local_scalar_dense", "aten::_to_copy", "aten::copy_", "aten::nonzero")

#: Ops that make the host wait for a CUDA device whatever their arguments: a value read on the host (item, float,
#: bool, int of a tensor all reach `_local_scalar_dense`), or an output size that depends on the data.
SYNC_OPS = frozenset({
    "_local_scalar_dense", "is_nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive", "nonzero",
    "argwhere", "bincount", "equal", "masked_select",
})  # fmt: skip
#: Indexing ops that sync only with a boolean (or uint8) index, which they turn into `nonzero` first.
_BOOL_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
#: Tensor methods that copy to the host (counted whatever the tensor's device: on a CPU trace every tensor is on the
#: CPU, where a CUDA run would sync).
_HOST_COPY_METHODS = ("tolist", "cpu", "numpy")


def _is_cpu(value: Any) -> bool:
    return str(value).startswith("cpu")


def sync_reason(func, args: tuple, kwargs: dict) -> str | None:
    """The name under which a dispatched op counts as a host sync on CUDA, or None (see `SyncCounter`)."""
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return name
    if name in _BOOL_INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
            return f"{name}[bool]"
    if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) and args[0].dim() >= 0:
        repeats = args[0] if func._overloadname == "Tensor" else args[1] if len(args) > 1 else None
        if isinstance(repeats, torch.Tensor) and repeats.numel() > 1:
            return "repeat_interleave(no output_size)"
    if name == "_to_copy" and _is_cpu(kwargs.get("device")) and not _is_cpu(args[0].device):
        return "_to_copy(cpu)"
    if name == "copy_" and _is_cpu(args[0].device) and not _is_cpu(args[1].device):
        return "copy_(to cpu)"
    return None


def _caller() -> str:
    """file:line of the innermost frame outside torch and this module: where a sync was asked for."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and not path.endswith("profile_step.py"):
            return f"{'/'.join(path.split('/')[-3:])}:{frame.lineno}"
    return "?"


class SyncCounter(TorchDispatchMode):
    """Counts the ops that force a host sync on CUDA, on any device (a CPU trace counts what a GPU would wait for).

    Counted: `SYNC_OPS`; `index`/`index_put` with a boolean index; `repeat_interleave` with tensor repeats and no
    `output_size`; copies to the CPU from another device; and the Tensor methods `tolist`, `cpu`, `numpy`
    (`_HOST_COPY_METHODS`, patched while the counter is active). `counts`: reason -> calls; `sites`: (reason, the
    caller's file:line) -> calls. `scope(name)` tallies what happens inside it in `scoped[name]` too.

        with SyncCounter() as syncs:
            loss = trainer._compute_loss(model, inputs); loss.backward()
        syncs.total
    """

    def __init__(self, sites: bool = True) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str]] = Counter()
        self.scoped: dict[str, Counter[str]] = {}
        self._paused = 0
        self._scopes: list[str] = []
        self._record_sites = sites
        self._saved: dict[str, Any] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _count(self, reason: str) -> None:
        self.counts[reason] += 1
        for scope in self._scopes:
            self.scoped.setdefault(scope, Counter())[reason] += 1
        if self._record_sites:
            self.sites[(reason, _caller())] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._paused:
            reason = sync_reason(func, args, kwargs)
            if reason is not None:
                self._count(reason)
        return func(*args, **kwargs)

    def scope(self, name: str, function):
        """`function` wrapped so that the syncs inside each call are also tallied under `scoped[name]`."""

        def scoped(*args, **kwargs):
            self._scopes.append(name)
            try:
                return function(*args, **kwargs)
            finally:
                self._scopes.pop()

        return scoped

    def __enter__(self):
        for method in _HOST_COPY_METHODS:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original

            def counted(tensor, *args, _original=original, _method=method, **kwargs):
                if not self._paused:
                    self._count(f"{_method}()")
                self._paused += 1  # the copy's own ops are this one sync
                try:
                    return _original(tensor, *args, **kwargs)
                finally:
                    self._paused -= 1

            setattr(torch.Tensor, method, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for method, original in self._saved.items():
                setattr(torch.Tensor, method, original)
            self._saved.clear()


class _Paused:
    """Within it, `counter` counts nothing (the generation of a batch is not the micro-batch's loss)."""

    def __init__(self, counter: SyncCounter | None) -> None:
        self.counter = counter

    def __enter__(self) -> None:
        if self.counter is not None:
            self.counter._paused += 1

    def __exit__(self, *exc) -> None:
        if self.counter is not None:
            self.counter._paused -= 1


def count_syncs(variant, sargs, device: str, dtype, tokenizer, dataset, workdir: str) -> dict[str, Any]:
    """Host syncs per micro-batch of one trainer: every `training_step` (loss, backward) of a short run, counted
    with `SyncCounter`, without `_prepare_inputs` (generation, scoring, the behaviour forward: once per generation
    batch). Returns the largest micro-batch's count, its breakdown and sites, and every micro-batch's total."""
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
        with _Paused(active[-1] if active else None):
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
        common.write_json(own.json, {"shape": overhead.shape_key(vocab, length), "tables": tables, "syncs": syncs})
    return {"tables": tables, "syncs": syncs}


if __name__ == "__main__":
    main()
