"""Where a trainer's optimizer step spends more than TRL's GRPOTrainer's: torch.profiler op counts and self CPU time.

Runs the overhead benchmark's workload (`benchmarks.overhead`: same model, fake sampler, settings) once per trainer
with the timed steps under `torch.profiler`, and prints, per trainer, the ops whose calls or self CPU time per step
differ most from TRL GRPOTrainer's, plus the counts that reveal overhead on a loaded machine too: all op calls,
`aten::item` / `aten::_local_scalar_dense` (host syncs on a GPU), `aten::_to_copy` (dtype casts). Op *counts* are
exact whatever the machine's load; times are only indicative on a shared machine.

Usage (from the repo root):
    python -m benchmarks.profile_step --trainers base,echo,otb --shapes 32000x128
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from . import common, overhead

WATCHED = ("aten::item", "aten::_local_scalar_dense", "aten::_to_copy", "aten::copy_", "aten::nonzero")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=12, help="Ops listed per trainer.")
    parser.add_argument("--json", type=Path, help="Also write the per-trainer op tables here.")
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
    vocab, length = args.shape_list[0]
    sargs = argparse.Namespace(**{**vars(args), "vocab_size": vocab or None, "completion_length": length})
    chosen = [v for v in chosen if overhead.availability(v, sargs, device, dtype) is None]
    dataset = overhead.make_prompts(64, args.prompt_length, args.seed)
    tables: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="profile-") as workdir:
        for variant in chosen:
            (record,) = overhead.run_trainers([variant], sargs, device, dtype, tokenizer, dataset, workdir,
                                              profile=True).values()  # fmt: skip
            steps = len(record["step_s"])
            tables[variant.name] = {
                "time_ms": overhead.repeat_time_ms(record),
                "ops": {
                    k: {"count": v["count"] / steps, "self_ms": v["self_cpu_us"] / 1e3 / steps}
                    for k, v in record["ops"].items()
                },  # fmt: skip
            }
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
        keys = set(ops) | set(base["ops"])
        diffs = []
        for k in keys:
            a, b = ops.get(k, {"count": 0, "self_ms": 0}), base["ops"].get(k, {"count": 0, "self_ms": 0})
            diffs.append((a["self_ms"] - b["self_ms"], a["count"] - b["count"], k, a["self_ms"], b["self_ms"]))
        diffs.sort(key=lambda d: -abs(d[0]))
        rows = [[k[:60], f"{dc:+.0f}", f"{dt:+.2f}", f"{a:.2f}", f"{b:.2f}"] for dt, dc, k, a, b in diffs[: own.top]]
        common.print_table(["op", "calls/step vs TRL", "self ms/step vs TRL", "self ms", "TRL self ms"], rows)
    if own.json:
        common.write_json(own.json, {"shape": overhead.shape_key(vocab, length), "tables": tables})
    return tables


if __name__ == "__main__":
    main()
