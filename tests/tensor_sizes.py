"""`TensorSizeRecorder`: the largest tensor any aten op creates inside a block, to test that a computation stays
tiled (pure torch: the objectives' tests use it too)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorSizeRecorder(TorchDispatchMode):
    """Records the largest numel of any tensor produced by an aten op, overall and per dtype."""

    def __init__(self):
        super().__init__()
        self.largest: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                self.largest[x.dtype] = max(self.largest.get(x.dtype, 0), x.numel())
        return out

    @property
    def largest_any(self) -> int:
        return max(self.largest.values(), default=0)
