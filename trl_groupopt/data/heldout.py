"""The held-out rows of a user's dataset: carved off before training by a seeded shuffle, so that `trl-groupopt
train` scores greedy accuracy on rows the policy never trained on, before and after (the synthetic task has its own
test split). `trl-groupopt compare` carves its shared split the same way (its seed: `comparison/driver.py`)."""

from __future__ import annotations

import os

__all__ = ["DEFAULT_MAX_HELDOUT", "SPLIT_SEED", "carve_heldout", "default_heldout_size", "split_heldout"]

SPLIT_SEED = 0
DEFAULT_MAX_HELDOUT = 200  # the synthetic task's held-out size
DEFAULT_SHARE = 10  # by default, one row in ten is held out...
DEFAULT_MIN_HELDOUT = 10  # ...when that makes at least this many: fewer prompts give no accuracy worth printing


def default_heldout_size(rows: int) -> int:
    """A tenth of `rows`, at most 200; 0 under 100 rows."""
    size = min(DEFAULT_MAX_HELDOUT, rows // DEFAULT_SHARE)
    return size if size >= DEFAULT_MIN_HELDOUT else 0


def split_heldout(dataset, size: int, seed: int = SPLIT_SEED):
    """(train, held-out): the first `size` rows of a shuffle of `dataset` with `seed` held out, the rest to train;
    `size` 0: (dataset, None)."""
    if size <= 0:
        return dataset, None
    if size >= len(dataset):
        raise ValueError(f"{size} held-out rows leave none of the {len(dataset)} rows to train on: hold out fewer.")
    shuffled = dataset.shuffle(seed=seed)
    return shuffled.select(range(size, len(dataset))), shuffled.select(range(size))


def carve_heldout(data, name: str, requested: int | None, evaluate: bool):
    """(train, held-out or None) of a checked `--dataset_name`: `requested` rows held out (None: the default size;
    `evaluate` False: none), said once on the main process."""
    size = 0 if not evaluate else default_heldout_size(len(data)) if requested is None else requested
    try:
        train, heldout = split_heldout(data, size)
    except ValueError as err:
        raise ValueError(
            f"--num_eval_examples {size}: --dataset_name {name} has {len(data)} usable rows; {err}"
        ) from None
    if os.environ.get("RANK", "0") == "0" and evaluate:
        if heldout is not None:
            print(f"[trl-groupopt] --dataset_name {name}: {size} of {len(data)} rows held out to score greedy "
                  f"accuracy before and after training; {len(train)} train (--num_eval_examples sets how many, 0 "
                  "none).", flush=True)  # fmt: skip
        elif requested is None:
            print(f"[trl-groupopt] --dataset_name {name}: {len(data)} rows, too few to hold a tenth out: no held-out "
                  "accuracy (--num_eval_examples N holds N rows out).", flush=True)  # fmt: skip
    return train, heldout
