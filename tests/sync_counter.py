"""Host syncs, counted: `SyncCounter` counts the ops that make the host wait for a CUDA device, on any device (a
CPU trace counts what a GPU run would wait for). `tests/trainers/test_host_syncs.py` counts with it each trainer's
syncs per micro-batch (loss and backward; `pytest -s` prints them) and fails on a sync inside an objective or on a
method that syncs more often than TRL's GRPOTrainer (its only user; it was `benchmarks/host_syncs.py`).
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_REPO = str(Path(__file__).resolve().parents[1]).replace("\\", "/") + "/"

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
    import torch

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
    """file:line of the innermost frame outside torch and this module, where a sync was asked for (repository files
    relative to its root, installed packages relative to site-packages)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith("sync_counter.py"):
            continue
        if path.startswith(_REPO):
            path = path[len(_REPO) :]
        elif "site-packages/" in path:
            path = path.split("site-packages/", 1)[1]
        return f"{path}:{frame.lineno}"
    return "?"


class SyncCounter:
    """Counts the ops that force a host sync on CUDA, on any device (a CPU trace counts what a GPU would wait for):
    `SYNC_OPS`; `index`/`index_put` with a boolean index; `repeat_interleave` with tensor repeats and no
    `output_size`; copies to the CPU from another device; and the Tensor methods `_HOST_COPY_METHODS` (patched while
    active). `counts`: reason -> calls; `sites`: (reason, the caller's file:line) -> calls; `scope(name, f)` tallies
    the syncs inside `f` in `scoped[name]` too. Torch is imported on entering, so `--help` imports none.

        with SyncCounter() as syncs:
            loss = trainer._compute_loss(model, inputs); loss.backward()
        syncs.total
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str]] = Counter()
        self.scoped: dict[str, Counter[str]] = {}
        self._paused, self._scopes, self._saved, self._mode = 0, [], {}, None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _count(self, reason: str) -> None:
        self.counts[reason] += 1
        for scope in self._scopes:
            self.scoped.setdefault(scope, Counter())[reason] += 1
        self.sites[(reason, _caller())] += 1

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Within it nothing is counted (e.g. a batch's generation, which is not the micro-batch's loss)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def scope(self, name: str, function):
        """`function` wrapped so that the syncs inside each call are also tallied under `scoped[name]`."""

        def scoped(*args, **kwargs):
            self._scopes.append(name)
            try:
                return function(*args, **kwargs)
            finally:
                self._scopes.pop()

        return scoped

    def __enter__(self) -> SyncCounter:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                reason = None if counter._paused else sync_reason(func, args, kwargs or {})
                if reason is not None:
                    counter._count(reason)
                return func(*args, **(kwargs or {}))

        for method in _HOST_COPY_METHODS:
            self._saved[method] = original = getattr(torch.Tensor, method)

            def counted(tensor, *args, _original=original, _method=method, **kwargs):
                if not self._paused:
                    self._count(f"{_method}()")
                with self.paused():  # the copy's own ops are this one sync
                    return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, method, counted)
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        try:
            self._mode.__exit__(*exc)
        finally:
            for method, original in self._saved.items():
                setattr(torch.Tensor, method, original)
            self._saved.clear()
