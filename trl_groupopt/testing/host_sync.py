"""Host syncs refused: `no_host_sync` raises on any op that would make the host wait for a GPU (on any device)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncError(AssertionError):
    """An op that makes the host wait for the device ran where none may."""


#: Ops that make the host wait for a CUDA device whatever their arguments: a value read on the host (`.item()`,
#: `float(t)`, `bool(t)` reach `_local_scalar_dense`) or an output shape that depends on the data.
SYNC_OPS = frozenset({
    "_local_scalar_dense", "is_nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive", "nonzero",
    "argwhere", "bincount", "equal", "masked_select",
})  # fmt: skip
_BOOL_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})  # sync with a boolean index
_HOST_METHODS = frozenset({"item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"})


class _RefuseSyncOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        indices = args[1] if name in _BOOL_INDEX_OPS and len(args) > 1 else ()
        if name in SYNC_OPS or any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
            raise HostSyncError(f"aten.{name}{'[bool index]' * (name in _BOOL_INDEX_OPS)}")
        return func(*args, **(kwargs or {}))


class _RefuseHostReads(TorchFunctionMode):  # on a CPU tensor `.tolist()` reaches no aten op: refuse the method
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in _HOST_METHODS:
            raise HostSyncError(f"Tensor.{func.__name__}()")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Raise `HostSyncError`, naming the op, on any host sync inside (on any device: a CPU run refuses what a GPU run
    would wait for)."""
    with _RefuseHostReads(), _RefuseSyncOps():
        yield
