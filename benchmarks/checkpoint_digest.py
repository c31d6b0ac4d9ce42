"""The cost of checkpoint integrity (`trl_groupopt/runfolder/checkpoints.py`): how fast a checkpoint's files are digested.

`python -m benchmarks.checkpoint_digest [--mb 512] [--repeats 3]` times, on one core and best of `--repeats`: SHA-256
(what the completion record stores), BLAKE2b and MD5 in memory, and `run_folder.file_digest` on a file of random
bytes (from the page cache, as right after a save) with and without its fsync. It prints MB/s and the verification
time of a 0.5B-parameter checkpoint: bf16 or fp32 weights, each with AdamW's fp32 state (2 tensors per parameter).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import timeit


def _digest(name: str, chunks: list[memoryview]) -> None:
    digest = hashlib.new(name)
    for chunk in chunks:
        digest.update(chunk)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="size of the test data in MB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from trl_groupopt.runfolder.checkpoints import file_digest

    data = os.urandom(args.mb * 1_000_000)
    chunks = [memoryview(data)[start : start + (8 << 20)] for start in range(0, len(data), 8 << 20)]

    def rate(fn) -> float:  # MB/s, best of --repeats
        return args.mb / min(timeit.repeat(fn, number=1, repeat=args.repeats))

    rates = {name: rate(lambda name=name: _digest(name, chunks)) for name in ("sha256", "blake2b", "md5")}
    with tempfile.NamedTemporaryFile(delete=False) as handle:
        handle.write(data)
    try:
        rates["file_digest (cached file)"] = rate(lambda: file_digest(handle.name))
        rates["file_digest + fsync"] = rate(lambda: file_digest(handle.name, sync=True))
    finally:
        os.unlink(handle.name)
    for name, rate in rates.items():
        print(f"{name:28s} {rate:8.0f} MB/s")
    for label, weight_bytes in (("bf16", 2), ("fp32", 4)):
        total_gb = 0.5e9 * (weight_bytes + 8) / 1e9
        print(f"0.5B params, {label} weights + fp32 AdamW state ({total_gb:.0f} GB): "
              f"{total_gb * 1000 / rates['file_digest (cached file)']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
