"""The cost of checkpoint integrity (`trl_groupopt/run_folder.py`): how fast a checkpoint's files are digested.

`python -m benchmarks.checkpoint_digest [--mb 512] [--repeats 3]` writes a file of random bytes, then times, on one
core: hashlib's SHA-256 (what the completion record stores), BLAKE2b and MD5 for comparison (in memory, the digest
alone), and `run_folder.file_digest` on the file (read from the page cache, as right after a save) plus its fsync.
It prints MB/s (best of `--repeats`) and the verification time of a 0.5B-parameter checkpoint: bf16 weights (~1 GB),
fp32 weights (~2 GB), each with the optimizer state (AdamW: 2 fp32 tensors per parameter, ~4 GB).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time

PARAMS = 0.5e9


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="size of the test data in MB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from trl_groupopt.run_folder import file_digest

    data = os.urandom(args.mb * 1_000_000)
    view = memoryview(data)
    chunk = 8 << 20

    def digest_in_memory(name: str):
        def run():
            digest = hashlib.new(name)
            for start in range(0, len(data), chunk):
                digest.update(view[start : start + chunk])

        return run

    rates = {name: args.mb / _best(digest_in_memory(name), args.repeats) for name in ("sha256", "blake2b", "md5")}
    with tempfile.NamedTemporaryFile(delete=False) as handle:
        handle.write(data)
        path = handle.name
    try:
        rates["file_digest (cached file)"] = args.mb / _best(lambda: file_digest(path), args.repeats)
        rates["file_digest + fsync"] = args.mb / _best(lambda: file_digest(path, sync=True), args.repeats)
    finally:
        os.unlink(path)
    for name, rate in rates.items():
        print(f"{name:28s} {rate:8.0f} MB/s")
    rate = rates["file_digest (cached file)"]
    for label, weight_bytes in (("bf16", 2), ("fp32", 4)):
        total_gb = PARAMS * (weight_bytes + 8) / 1e9
        print(f"0.5B params, {label} weights + fp32 AdamW state ({total_gb:.0f} GB): {total_gb * 1000 / rate:.1f} s")


if __name__ == "__main__":
    main()
