"""The held-out split every run of a comparison shares (DIR/data), carved once, before anything runs or is submitted
(docs/compare.md, "What it does").

With `--dataset_name`, the first `--eval_examples` rows of a seeded shuffle are held out (`data.heldout.split_heldout`,
the split `train` carves too) into DIR/data/heldout.jsonl, the rest into DIR/data/train.jsonl, and DIR/data/split.json
records the data file's sha256: a file edited in place is refused in a folder whose runs trained on the old rows
(and carved again in one without runs), never silently paired with them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..runfolder.checkpoints import file_digest, read_json
from .argv import scan
from .options import PROG, CompareError, Options

#: Options naming the user's data: replaced, for the runs, by the training part of the carved split.
DATA_OPTIONS = ("dataset_name", "dataset_config", "dataset_format", "dataset_train_split")
SPLIT_FILE = "split.json"
#: compare scores the runs itself: a run does not hold rows of its own out (train's --num_eval_examples)
NO_HELDOUT = ("--num_eval_examples", "0")


def digest(name: str) -> str | None:
    """sha256 of a local data file, or of a folder's files (names and bytes); None for a Hub dataset."""
    path = Path(name).expanduser()
    if path.is_file():
        return file_digest(path)  # what `sha256sum` prints for it
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    if not files:
        return None
    total = hashlib.sha256()  # over each file's name and digest: a rename or an edit changes it
    for file in files:
        total.update(f"{file.relative_to(path)}\0{file_digest(file)}\n".encode())
    return total.hexdigest()


def _carve(options: Options, given: dict[str, Any], data_dir: Path, sha: str | None) -> None:
    """Load the user's rows, hold `--eval_examples` out, write the two files and split.json; said in one line (no
    progress bars of the datasets library)."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        _write_split(options, given, data_dir, sha)
    finally:
        if shown:
            datasets.enable_progress_bars()


def _write_split(options: Options, given: dict[str, Any], data_dir: Path, sha: str | None) -> None:
    from ..data.adapters import load_raw_dataset, to_prompt_solution
    from ..data.heldout import SPLIT_SEED, split_heldout

    name, size = given["dataset_name"], options.eval_examples
    try:
        raw = load_raw_dataset(name, given["dataset_config"], given["dataset_train_split"] or "train")
        data = to_prompt_solution(raw, given["dataset_format"] or "prompt-answer")
    except Exception as error:  # noqa: BLE001 - a dataset that cannot be read or reached (offline): one line
        if isinstance(error, ValueError):
            raise CompareError(" ".join(str(error).split())) from None
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise CompareError(f"--dataset_name {name} cannot be loaded ({type(error).__name__}: {first}): check the name, "
                           "or its connection (offline: a local file or folder)") from None  # fmt: skip
    if len(data) - size < size:  # the runs would train on fewer rows than they are scored on
        raise CompareError(f"--eval_examples {size} would hold out {size} of the {len(data)} rows of --dataset_name "
                           f"{name}, leaving {max(0, len(data) - size)} to train on, fewer than it holds out: pass "
                           f"--eval_examples {len(data) // 2} or fewer, or give more rows.")  # fmt: skip
    train, heldout = split_heldout(data.select_columns(["prompt", "solution"]), size, SPLIT_SEED)
    data_dir.mkdir(parents=True, exist_ok=True)
    heldout.to_json(str(data_dir / "heldout.jsonl"), lines=True)
    train.to_json(str(data_dir / "train.jsonl"), lines=True)
    record = {"dataset_name": str(Path(name).expanduser().resolve()) if sha else name, "sha256": sha,
              "rows": len(data), "heldout": size, "train": len(train), "seed": SPLIT_SEED}  # fmt: skip
    (data_dir / SPLIT_FILE).write_text(json.dumps(record) + "\n")
    print(f"{PROG}: --dataset_name {name}: {size} of {len(data)} rows held out ({data_dir / 'heldout.jsonl'}), the "
          f"other {len(train)} train every run ({data_dir / 'train.jsonl'})", flush=True)  # fmt: skip


def _check_source(name: str, sha: str | None, data_dir: Path, has_runs: bool) -> bool:
    """Whether DIR/data still holds the split of `name` as it is now, of sha256 `sha` (True), or must be carved again
    (False: no run used it); CompareError when runs trained on the split of a file since changed."""
    path = data_dir / SPLIT_FILE
    made = read_json(path)
    if not isinstance(made, dict) or not made.get("sha256"):  # carved before split.json, or a Hub dataset
        if made is None and sha:
            path.write_text(json.dumps({"dataset_name": name, "sha256": sha}) + "\n")
        return True
    if sha is None or sha == made["sha256"]:
        return True
    if not has_runs:
        print(f"{PROG}: --dataset_name {name} changed since {data_dir} was carved from it, and no run used that "
              "split: carving it again", flush=True)  # fmt: skip
        return False
    raise CompareError(f"--dataset_name {name} changed since its held-out split was carved into {data_dir} (sha256 "
                       f"{made['sha256'][:12]} then, {sha[:12]} now), and this folder's runs trained on the old rows: "
                       "restore the file, or give this data another --output_dir.")  # fmt: skip


def carve_heldout(options: Options, data_dir: Path, has_runs: bool = False) -> tuple[list[str], bool]:
    """(every run's train options, whether compare scores DATA/heldout.jsonl itself): the held-out split every run
    shares, carved once from `--dataset_name` (the rest in DATA/train.jsonl), or the synthetic task's test split
    (the embedded policy's runs score it themselves). `has_runs`: the folder holds runs already."""
    from ..data.offline import make_arithmetic_dataset, uses_embedded_policy

    given, rest = scan(options.train_args, *DATA_OPTIONS)
    name, heldout_path, train_path = given["dataset_name"], data_dir / "heldout.jsonl", data_dir / "train.jsonl"
    if name is None:
        if uses_embedded_policy(scan(options.train_args, "model_name_or_path")[0]["model_name_or_path"]):
            return [*options.train_args, "--num_eval_examples", str(options.eval_examples)], False
        if not heldout_path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            test = make_arithmetic_dataset(options.eval_examples, seed=0, split="test")
            test.select_columns(["prompt", "solution"]).to_json(str(heldout_path), lines=True)
        return [*options.train_args, *NO_HELDOUT], True
    carved, sha = train_path.exists() and heldout_path.exists(), digest(name)
    if not (carved and _check_source(name, sha, data_dir, has_runs)):
        _carve(options, given, data_dir, sha)
    return [*rest, "--dataset_name", str(train_path), "--dataset_format", "prompt-answer", *NO_HELDOUT], True
