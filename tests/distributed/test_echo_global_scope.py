"""ECHO "global" batch-ratio scope with 2 CPU processes (gloo), against one process over the union.

Each rank holds half the rows, all-reduces its detached sum(log_r) and token count, calls
echo_loss with those totals, aggregates sum(per_token_loss * mask) / GLOBAL token count ("dapo")
and backprops. Checked to 1e-10 in float64:
  * exact mode (second all-reduce of echo_batch_ratio_coupling -> coupling_sum): the ranks' losses
    sum to the union's loss and their concatenated gradients equal the union's gradient;
  * the totals alone (no coupling_sum): the loss is right, but when R is not clipped the
    gradient misses the cross-process coupling terms (so it differs); when R is clipped there is
    no coupling and it is exact;
  * "micro_batch" scope (no totals) differs from the union when the halves' mean log-ratios differ;
  * with per-token loss weights (the trainer's vLLM IS weights and masks, zeros included) and the weighted coupling,
    the ranks' gradients are the union's weighted gradient.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trl_groupopt.methods.echo.objective import echo_batch_ratio_coupling, echo_loss

F64 = torch.float64
WORLD = 2
EPS = dict(epsilon_low=0.2, epsilon_high=0.28, batch_epsilon_low=0.15, batch_epsilon_high=0.15)


def make_batch(shift_first: float, shift_second: float):
    """8 rows, 4 per rank; rank 0's log-ratios centre on shift_first, rank 1's on shift_second."""
    g = torch.Generator().manual_seed(11)
    B, T = 8, 6
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    shift = torch.tensor([shift_first] * 4 + [shift_second] * 4, dtype=F64).unsqueeze(1)
    logp = old + shift + 0.1 * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.ones(B, T, dtype=F64)
    mask[1, 4:] = 0
    mask[5, 1:3] = 0  # hole
    mask[6, 3:] = 0
    adv = torch.randn(B, generator=g, dtype=F64)
    return logp, old, adv, mask


def make_weights():
    """(8, 6) per-token loss weights: IS-like values in [0, 3), a masked token per row, a masked row on each rank."""
    g = torch.Generator().manual_seed(12)
    weights = 3 * torch.rand(8, 6, generator=g, dtype=F64)
    weights[torch.arange(8), torch.randint(0, 6, (8,), generator=g)] = 0.0
    weights[[2, 7]] = 0.0
    return weights


SCENARIOS = {
    # union mean log-ratio ~ 0 (R not clipped) while each half alone is clipped (e^{+-0.3} vs 1 +- 0.15)
    "halves_differ": (0.3, -0.3),
    # R clipped over the union as well
    "batch_clipped": (0.4, 0.35),
}


def _backward(logp, old, adv, mask, agg_count, **kw):
    logp = logp.clone().requires_grad_(True)
    out = echo_loss(logp, old, adv, mask, **EPS, **kw)
    loss = (out.per_token_loss * mask).sum() / agg_count
    loss.backward()
    return loss.detach(), logp.grad


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = {}
        rows = slice(4 * rank, 4 * rank + 4)
        for name, shifts in SCENARIOS.items():
            logp, old, adv, mask = (x[rows] for x in make_batch(*shifts))
            totals = torch.stack([((logp - old) * mask).sum(), mask.sum()])  # detached local totals
            dist.all_reduce(totals)
            scope = dict(log_ratio_sum=totals[0], token_count=totals[1])
            coupling = echo_batch_ratio_coupling(logp, old, adv, mask, **EPS, **scope)
            dist.all_reduce(coupling)
            weights = make_weights()[rows]
            weighted = echo_batch_ratio_coupling(logp, old, adv, mask, importance_weights=weights, **EPS, **scope)
            dist.all_reduce(weighted)
            results[name] = {
                "exact": _backward(logp, old, adv, mask, totals[1], coupling_sum=coupling, **scope),
                "weighted": _backward(
                    logp, old, adv, mask, totals[1], coupling_sum=weighted, importance_weights=weights, **scope
                ),
                "totals_only": _backward(logp, old, adv, mask, totals[1], **scope),
                "micro_batch": _backward(logp, old, adv, mask, totals[1]),
            }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_global_scope_two_processes_match_union(tmp_path):
    # fork (Linux) reuses the parent's imports: spawn re-imports torch/TRL in each child (~10 s on CI)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(
        _worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True, start_method=method
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for name, shifts in SCENARIOS.items():
        logp, old, adv, mask = make_batch(*shifts)
        union_loss, union_grad = _backward(logp, old, adv, mask, mask.sum())  # one process, whole batch
        union_clipped = echo_loss(logp, old, adv, mask, **EPS).metrics["echo/batch_clipped"].item()
        assert union_clipped == float(name == "batch_clipped")

        def combined(mode, name=name):
            loss = sum(rank[name][mode][0] for rank in ranks)
            grad = torch.cat([rank[name][mode][1] for rank in ranks])
            return loss, grad

        loss, grad = combined("exact")
        torch.testing.assert_close(loss, union_loss, rtol=0, atol=1e-10)
        torch.testing.assert_close(grad, union_grad, rtol=0, atol=1e-10)

        weighted_loss, weighted_grad = _backward(logp, old, adv, mask, mask.sum(), importance_weights=make_weights())
        loss, grad = combined("weighted")
        torch.testing.assert_close(loss, weighted_loss, rtol=0, atol=1e-10)
        torch.testing.assert_close(grad, weighted_grad, rtol=0, atol=1e-10)
        assert (weighted_grad - union_grad).abs().max() > 1e-3  # the weights matter

        loss, grad = combined("totals_only")
        torch.testing.assert_close(loss, union_loss, rtol=0, atol=1e-10)
        if name == "batch_clipped":  # no coupling term: the totals alone are exact
            torch.testing.assert_close(grad, union_grad, rtol=0, atol=1e-10)
        else:  # cross-process coupling is missing without coupling_sum
            assert (grad - union_grad).abs().max() > 1e-4

        loss, grad = combined("micro_batch")
        if name == "halves_differ":  # each half clips its own R, the union's R is not clipped
            assert (loss - union_loss).abs() > 1e-3
            assert (grad - union_grad).abs().max() > 1e-3
