"""An objective's metrics reduced over processes as TRL reduces its own (masked means; per-sequence min/max of the clip
indicators; scalars nan-averaged), queued per micro-batch and flushed with one collective and one host sync (TRL: one
of each per metric, which stalls a GPU a dozen times per micro-batch)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

#: The objectives' clip indicators, logged under TRL's names (`<name>_mean`, and `_min` / `_max` per sequence).
CLIP_METRICS = ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region")


def _masked_stats(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if values.shape[1] == 1:
        return values.sum(), values.new_tensor(float(values.shape[0]))
    mask = mask.to(values.dtype)
    return (values * mask).sum(), mask.sum()


def _sequence_extreme(value: Tensor, mask: Tensor, low: bool) -> Tensor:
    """TRL's `clip_ratio/low_min` / `high_max` on this process (+-inf when there is none)."""
    per_sequence = value.squeeze(1) if value.shape[1] == 1 else (value * mask).sum(-1) / mask.sum(-1)
    fill = torch.full_like(per_sequence, float("inf") if low else float("-inf"))
    per_sequence = torch.where(torch.isnan(per_sequence), fill, per_sequence)
    return per_sequence.amin() if low else per_sequence.amax()


def _local_columns(metrics: dict[str, Tensor], mask: Tensor, mode: str) -> tuple[list[tuple[str, str, str]], list]:
    """(mode, logged name, reduction) columns and local (value, weight) pairs, in the same order on every rank."""
    columns, local = [], []
    for name in sorted(metrics):
        value = metrics[name].detach().float()
        logged = name + "_mean" if name in CLIP_METRICS else name
        if value.dim() == 2:
            local += _masked_stats(value, mask)
            columns.append((mode, logged, "mean"))
            if name in ("clip_ratio/low", "clip_ratio/high"):
                low = name.endswith("low")
                extreme = _sequence_extreme(value, mask, low)
                local += [extreme, extreme]
                columns.append((mode, name + ("_min" if low else "_max"), "min" if low else "max"))
        else:
            value = value.reshape(())
            finite = ~torch.isnan(value)
            local += [torch.where(finite, value, torch.zeros_like(value)), finite.float()]
            columns.append((mode, logged, "nanmean"))
    return columns, local


class MetricsQueue:
    """The loss path's metrics between their computation and the log, on device: `add` queues a micro-batch's (the
    objective's, the estimator's, TRL's shared ones), `flush` reduces everything queued over processes in one
    collective and reads it with one host sync. `GroupOptTrainer` flushes once per micro-batch, at the end of
    `_compute_loss` (`TRLHooks._flush_metrics`, the one place that writes them to TRL's log)."""

    def __init__(self) -> None:
        self.pending: list[tuple[dict[str, Tensor], Tensor, str]] = []  # (metrics, (B, T) mask, "train" | "eval")

    def add(self, metrics: dict[str, Tensor], mask: Tensor, mode: str) -> None:
        """Queue `metrics`: 0-dim values (averaged over processes, NaN ignored), (B, T) / (B, 1) values (averaged
        over `mask`'s tokens on every process), TRL's clip indicators (also their per-sequence min / max)."""
        self.pending.append((metrics, mask, mode))

    @contextmanager
    def discarded(self) -> Iterator[None]:
        """Drop the metrics queued inside (computations that only prepare the loss)."""
        queued = len(self.pending)
        try:
            yield
        finally:
            del self.pending[queued:]

    def flush(self, accelerator) -> list[tuple[str, str, float]]:
        """Everything queued, reduced over `accelerator`'s processes: ``[(mode, logged name, value)]``; empties it."""
        # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `clip_ratio/*` metrics (names, nanmin/nanmax over
        # sequences) and `global_masked_mean`, batched into one collective
        pending, self.pending = self.pending, []
        columns: list[tuple[str, str, str]] = []  # (mode, logged name, reduction: a key of `kinds` below)
        local: list[Tensor] = []  # two entries per column
        for metrics, mask, mode in pending:
            more_columns, more_local = _local_columns(metrics, mask, mode)
            columns += more_columns
            local += more_local
        if not columns:
            return []
        stats = torch.stack([t.to(accelerator.device) for t in local]).view(1, len(columns), 2)  # (1, K, 2)
        gathered = accelerator.gather(stats)  # (P, K, 2)
        sums, mins, maxs = gathered.sum(0), gathered.amin(0), gathered.amax(0)  # (K, 2) each
        mean = sums[:, 0] / sums[:, 1].clamp(min=1.0)  # TRL: 0 for an empty mask
        nanmean = torch.where(sums[:, 1] > 0, mean, torch.full_like(mean, float("nan")))  # gather().nanmean()
        kinds = {"mean": mean, "nanmean": nanmean, "min": mins[:, 0], "max": maxs[:, 0]}
        table = dict(zip(kinds, torch.stack(list(kinds.values())).tolist(), strict=True))  # the one sync
        out = [(mode, logged, table[kind][k]) for k, (mode, logged, kind) in enumerate(columns)]
        return [(mode, logged, float("nan") if abs(v) == float("inf") else v) for mode, logged, v in out]
