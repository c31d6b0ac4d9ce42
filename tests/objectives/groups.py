"""`groups_of`: the `Groups` of a (B,) tensor of group ids in the layout the trainer delivers (consecutive runs of one
size), for tests that write their batches by ids."""

from __future__ import annotations

import torch

from trl_groupopt.core.common import Groups


def groups_of(group_ids: torch.Tensor | list[int]) -> Groups:
    """`Groups.contiguous` of `group_ids`, checked to be consecutive runs of equal length (the only layout training
    produces: `trl_groupopt/trainer/batching.py`)."""
    ids = torch.as_tensor(group_ids)
    _, counts = torch.unique_consecutive(ids, return_counts=True)
    size = int(counts[0]) if counts.numel() else 1
    assert ids.unique().numel() == counts.numel() and bool((counts == size).all()), f"not whole groups: {ids}"
    return Groups.contiguous(ids.numel(), size)
