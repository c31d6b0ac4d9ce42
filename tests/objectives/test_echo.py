"""ECHO objective (arXiv "ECHO", Eq. 5-11, 15, 34, App. A.2) against float64 loop references.

Tolerances: float64 comparisons use atol/rtol 1e-12 (loss) and 1e-12 (gradients); the bf16 check
compares with a float32 run on the same bf16-rounded inputs to 1e-6.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.objectives.metrics import reduce_metrics
from trl_groupopt.methods.echo.objective import MAX_LOG_RHO, echo_batch_ratio_coupling, echo_loss

F64 = torch.float64
EPS = dict(epsilon_low=0.2, epsilon_high=0.28, batch_epsilon_low=0.1, batch_epsilon_high=0.15)


# ----------------------------------------------------------------------------------------------
# Independent float64 loop reference (plain Python floats, derived by hand from Eq. 6-11)
# ----------------------------------------------------------------------------------------------
def ref_echo(
    logp,
    old,
    adv,
    mask,
    *,
    epsilon_low,
    epsilon_high,
    batch_epsilon_low,
    batch_epsilon_high,
    token_clip=True,
    totals=None,
    coupling_total=None,
    agg_count=None,
    weights=None,
):
    """dapo-aggregated loss sum(w*loss*mask)/agg_count and its gradient d/d logp (nested lists).

    totals = (global sum log_r, global count) simulates the "global" scope for a slice: only this
    slice's tokens carry gradient into log R. coupling_total replaces the slice's own coupling
    sum_{j,k} d loss_jk / d log R by the all-process total (the exact global gradient). weights: (B, T) or (B, 1)
    per-token loss weights w (constants; None: 1): every token's loss and its d / d log rho are scaled by w, so the
    coupling is sum_{j,k} w_jk d loss_jk / d log R, and R is unchanged.
    """
    logp, old, mask = logp.tolist(), old.tolist(), mask.tolist()
    adv = adv.tolist()
    B, T = len(logp), len(logp[0])
    weights = [[1.0]] * B if weights is None else weights.tolist()

    def a(i, t):
        return adv[i] if not isinstance(adv[i], list) else adv[i][t]

    def w(i, t):
        return weights[i][t if len(weights[i]) > 1 else 0]

    log_r = [[(logp[i][t] - old[i][t]) if mask[i][t] > 0 else 0.0 for t in range(T)] for i in range(B)]
    n_local = sum(1 for i in range(B) for t in range(T) if mask[i][t] > 0)
    s, n = (sum(map(sum, log_r)), n_local) if totals is None else totals
    log_big_r = s / max(n, 1)
    lo = math.log(1 - batch_epsilon_low)
    hi = math.log(1 + batch_epsilon_high)
    batch_free = lo <= log_big_r <= hi  # R not clipped: log C depends on log R
    c = math.exp(min(max(log_big_r, lo), hi) - log_big_r)

    total, d = 0.0, [[0.0] * T for _ in range(B)]  # d = d loss_it / d log rho_it
    for i in range(B):
        for t in range(T):
            if mask[i][t] <= 0:
                continue
            rho = math.exp(log_r[i][t]) * c
            A = a(i, t)
            if token_clip:
                lower, upper = 1 - epsilon_low, 1 + epsilon_high
                clipped = min(max(rho, lower), upper)
                if rho * A <= clipped * A:
                    loss, grad = -rho * A, -rho * A
                else:
                    loss, grad = -clipped * A, 0.0
            else:
                loss, grad = -rho * A, -rho * A
            total += w(i, t) * loss
            d[i][t] = w(i, t) * grad
    coupling = sum(map(sum, d)) if coupling_total is None else coupling_total
    coupling = coupling if batch_free else 0.0
    agg = agg_count if agg_count is not None else max(n, 1)
    grads = [[(d[i][t] + coupling / max(n, 1)) / agg if mask[i][t] > 0 else 0.0 for t in range(T)] for i in range(B)]
    return total / agg, grads, c, sum(map(sum, d))


def make_inputs(seed, B=5, T=7, shift=0.0, scale=0.2, adv_2d=False, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    logp = old + shift + scale * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.ones(B, T, dtype=F64)
    mask[1, 5:] = 0  # shorter row
    mask[2, 2:4] = 0  # hole (tool tokens)
    mask[3, :] = 0  # empty row
    adv = torch.randn(B, T, generator=g, dtype=F64) if adv_2d else torch.randn(B, generator=g, dtype=F64)
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def run_echo(logp, old, adv, mask, agg_count=None, **kwargs):
    logp = logp.clone().requires_grad_(True)
    out = echo_loss(logp, old, adv, mask, **kwargs)
    count = mask.sum().clamp(min=1) if agg_count is None else agg_count
    loss = (out.per_token_loss * mask).sum() / count  # trainer's "dapo" aggregation
    loss.backward()
    return out, loss.detach(), logp.grad


CASES = [
    # (name, shift, scale, eps overrides) -- "clipped": R outside [1 - 0.1, 1 + 0.15]
    ("unclipped", 0.0, 0.2, {}),
    ("batch_clipped_high", 0.3, 0.2, {}),
    ("batch_clipped_low", -0.3, 0.2, {}),
]


@pytest.mark.parametrize("name,shift,scale,overrides", CASES)
@pytest.mark.parametrize("token_clip", [True, False])
@pytest.mark.parametrize("adv_2d", [False, True])
def test_micro_batch_matches_loop_reference(name, shift, scale, overrides, token_clip, adv_2d):
    logp, old, adv, mask = make_inputs(1, shift=shift, scale=scale, adv_2d=adv_2d)
    kw = {**EPS, **overrides, "token_clip": token_clip}
    out, loss, grad = run_echo(logp, old, adv, mask, **kw)
    ref_loss, ref_grad, ref_c, _ = ref_echo(logp, old, adv, mask, **kw)
    assert (out.metrics["echo/batch_clipped"].item() == 1.0) == (name != "unclipped")
    assert (abs(ref_c - 1.0) > 1e-3) == (name != "unclipped")  # the case is what its name says
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=F64), rtol=1e-12, atol=1e-12)
    if token_clip:  # the token clip is active on some tokens, so the min/clip branches are exercised
        assert reduce_metrics(out.metrics, mask)["clip_ratio/region"].item() > 0


@pytest.mark.parametrize("name,shift,scale,overrides", CASES)
@pytest.mark.parametrize("token_clip", [True, False])
@pytest.mark.parametrize("adv_2d", [False, True])
def test_global_scope_slice_matches_loop_reference(name, shift, scale, overrides, token_clip, adv_2d):
    """A slice of a larger batch with the larger batch's totals, with and without coupling_sum."""
    logp, old, adv, mask = make_inputs(2, B=8, shift=shift, scale=scale, adv_2d=adv_2d)
    mask[6, 1:] = 0
    kw = {**EPS, **overrides, "token_clip": token_clip}
    log_r = (logp - old) * mask
    totals = (log_r.sum().item(), int(mask.sum().item()))
    full_loss, full_grad, _, full_coupling = ref_echo(logp, old, adv, mask, **kw)

    sl = slice(0, 3)
    part = (logp[sl], old[sl], adv[sl], mask[sl])
    g_kw = dict(kw, log_ratio_sum=torch.tensor(totals[0], dtype=F64), token_count=torch.tensor(totals[1]))
    # totals alone (no coupling_sum): value global, coupling of this slice's own tokens
    out, loss, grad = run_echo(*part, agg_count=totals[1], **g_kw)
    ref_loss, ref_grad, _, _ = ref_echo(*part, **kw, totals=totals, agg_count=totals[1])
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=F64), rtol=1e-12, atol=1e-12)

    # exact: with the all-process coupling the slice's gradient is the full batch's gradient rows
    coupling = sum(
        echo_batch_ratio_coupling(logp[s], old[s], adv[s], mask[s], **g_kw) for s in (slice(0, 3), slice(3, 8))
    )
    assert coupling.item() == pytest.approx(full_coupling if name == "unclipped" else 0.0, abs=1e-12)
    out, loss, grad = run_echo(*part, agg_count=totals[1], coupling_sum=coupling, **g_kw)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)  # the extra term has value 0
    torch.testing.assert_close(grad, torch.tensor(full_grad[:3], dtype=F64), rtol=1e-12, atol=1e-12)


def test_global_scope_equals_micro_batch_on_whole_batch():
    logp, old, adv, mask = make_inputs(3, shift=0.05)
    log_r = (logp - old) * mask
    a = run_echo(logp, old, adv, mask, **EPS)
    b = run_echo(logp, old, adv, mask, **EPS, log_ratio_sum=log_r.sum(), token_count=mask.sum())
    torch.testing.assert_close(a[0].per_token_loss, b[0].per_token_loss, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(a[2], b[2], rtol=1e-13, atol=1e-13)


# ----------------------------------------------------------------------------------------------
# Per-token loss weights (the trainer's vLLM IS weights, off-policy and entropy masks)
# ----------------------------------------------------------------------------------------------
WEIGHT_KINDS = ("token", "sequence", "token_mask", "sequence_mask")


def loss_weights(kind, batch, length, seed=0):
    """(B, T) or (B, 1) weights as the trainer passes them: positive IS-like weights or 0/1 masks; row 0 all 0 (a
    masked-out sequence: it still forms R, so it still carries the coupling)."""
    g = torch.Generator().manual_seed(seed)
    size = (batch, length) if kind.startswith("token") else (batch, 1)
    weights = torch.rand(size, generator=g, dtype=F64)
    weights = (weights < 0.6).to(F64) if kind.endswith("mask") else 3 * weights
    weights[0] = 0.0
    return weights


@pytest.mark.parametrize("name,shift,scale,overrides", CASES)
@pytest.mark.parametrize("kind", WEIGHT_KINDS)
def test_weighted_micro_batch_matches_loop_reference(name, shift, scale, overrides, kind):
    logp, old, adv, mask = make_inputs(11, shift=shift, scale=scale)
    weights = loss_weights(kind, *mask.shape)
    kw = {**EPS, **overrides}
    out, loss, grad = run_echo(logp, old, adv, mask, importance_weights=weights, **kw)
    ref_loss, ref_grad, _, _ = ref_echo(logp, old, adv, mask, weights=weights, **kw)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=F64), rtol=1e-12, atol=1e-12)
    # row 0 has weight 0: no loss of its own, but with R unclipped its tokens carry the coupling through log R
    assert (out.per_token_loss[0] == 0).all()
    assert bool((grad[0] != 0).any()) == (name == "unclipped")


@pytest.mark.parametrize("name,shift,scale,overrides", CASES)
@pytest.mark.parametrize("kind", WEIGHT_KINDS)
def test_weighted_global_scope_slices_sum_to_the_union(name, shift, scale, overrides, kind):
    """Two slices with the union's totals and the weighted coupling_sum give the union's weighted gradient; a
    coupling that ignores the weights does not (when R is unclipped)."""
    logp, old, adv, mask = make_inputs(12, B=8, shift=shift, scale=scale)
    weights = loss_weights(kind, *mask.shape, seed=1)
    kw = {**EPS, **overrides}
    full_loss, full_grad, _, _ = ref_echo(logp, old, adv, mask, weights=weights, **kw)
    count = mask.sum()
    g_kw = dict(kw, log_ratio_sum=((logp - old) * mask).sum(), token_count=count)
    parts = (slice(0, 3), slice(3, 8))

    def union_from_slices(coupling_weights):
        coupling = sum(
            echo_batch_ratio_coupling(logp[s], old[s], adv[s], mask[s], importance_weights=coupling_weights[s], **g_kw)
            for s in parts
        )
        runs = [
            run_echo(logp[s], old[s], adv[s], mask[s], agg_count=count, coupling_sum=coupling,
                     importance_weights=weights[s], **g_kw)
            for s in parts
        ]  # fmt: skip
        return sum(run[1] for run in runs), torch.cat([run[2] for run in runs])

    loss, grad = union_from_slices(weights)
    assert loss.item() == pytest.approx(full_loss, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(full_grad, dtype=F64), rtol=0, atol=1e-12)
    _, unweighted = union_from_slices(torch.ones_like(weights))
    if name == "unclipped":
        assert (unweighted - grad).abs().max() > 1e-6  # 1e6 times the tolerance above
    else:  # R clipped: no coupling at all
        torch.testing.assert_close(unweighted, grad, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Gradient identity (Eq. 34; Eq. 15 as printed is not what autograd gives)
# ----------------------------------------------------------------------------------------------
def _identity_inputs(shift):
    logp, old, adv, mask = make_inputs(4, B=6, T=9, shift=shift, scale=0.05, adv_2d=True)
    return logp, old, adv, mask


@pytest.mark.parametrize("token_clip", [False, True])
def test_gradient_identity_unclipped_eq34(token_clip):
    logp, old, adv, mask = _identity_inputs(0.0)
    eps = dict(EPS, epsilon_low=1e6, epsilon_high=1e6) if token_clip else EPS  # wide token clip
    logp = logp.clone().requires_grad_(True)
    out = echo_loss(logp, old, adv, mask, token_clip=token_clip, **eps)
    n = mask.sum()
    objective = -(out.per_token_loss * mask).sum() / n  # J = (1/N) sum rho A mask
    (grad,) = torch.autograd.grad(objective, logp)
    assert out.metrics["echo/batch_clipped"].item() == 0.0
    r = torch.exp((logp.detach() - old) * mask)
    big_r = torch.exp(((logp.detach() - old) * mask).sum() / n)
    c = 1.0  # R not clipped
    big_l = (r * adv * mask).sum() / n
    eq34 = c / n * (adv * r + big_l) * mask
    torch.testing.assert_close(grad, eq34, rtol=1e-12, atol=1e-12)
    # Eq. 15 as printed: C (1/N) rho (A + L/R). It differs (r != R per token); the docstring says so.
    eq15 = c / n * r * (adv + big_l / big_r) * mask
    assert (grad - eq15).abs().max() > 1e-4


def test_gradient_identity_batch_clipped_no_coupling():
    logp, old, adv, mask = _identity_inputs(0.4)  # R = e^0.4 > 1.15: clipped
    logp = logp.clone().requires_grad_(True)
    out = echo_loss(logp, old, adv, mask, token_clip=False, **EPS)
    n = mask.sum()
    (grad,) = torch.autograd.grad(-(out.per_token_loss * mask).sum() / n, logp)
    assert out.metrics["echo/batch_clipped"].item() == 1.0
    log_r = (logp.detach() - old) * mask
    c = (1 + EPS["batch_epsilon_high"]) / torch.exp(log_r.sum() / n)  # R_bar / R
    torch.testing.assert_close(grad, c / n * adv * torch.exp(log_r) * mask, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------
def test_metrics_match_loop():
    logp, old, adv, mask = make_inputs(5, shift=0.3, adv_2d=True)
    out = echo_loss(logp, old, adv, mask, **EPS)
    m = mask.tolist()
    log_r = [[(logp[i, t] - old[i, t]).item() * m[i][t] for t in range(7)] for i in range(5)]
    n = sum(map(sum, m))
    big_r = math.exp(sum(map(sum, log_r)) / n)
    c = min(max(big_r, 0.9), 1.15) / big_r
    low = high = 0
    for i in range(5):
        for t in range(7):
            if m[i][t]:
                rho = math.exp(log_r[i][t]) * c
                low += rho < 0.8 and adv[i, t].item() < 0
                high += rho > 1.28 and adv[i, t].item() > 0
    assert out.metrics["echo/batch_ratio"].item() == pytest.approx(big_r, rel=1e-6)
    assert out.metrics["echo/batch_clipped"].item() == 1.0
    assert reduce_metrics(out.metrics, mask)["clip_ratio/low"].item() == pytest.approx(low / n, abs=1e-7)
    assert reduce_metrics(out.metrics, mask)["clip_ratio/high"].item() == pytest.approx(high / n, abs=1e-7)
    assert reduce_metrics(out.metrics, mask)["clip_ratio/region"].item() == pytest.approx((low + high) / n, abs=1e-7)
    assert high > 0
    for v in reduce_metrics(out.metrics, mask).values():
        assert v.dim() == 0 and v.dtype == torch.float32 and not v.requires_grad
    no_clip = echo_loss(logp, old, adv, mask, **EPS, token_clip=False)
    assert reduce_metrics(no_clip.metrics, mask)["clip_ratio/region"].item() == 0.0


# ----------------------------------------------------------------------------------------------
# Numerics: extreme ratios, empty masks, bf16
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("token_clip", [True, False])
@pytest.mark.parametrize("scope", ["micro_batch", "global"])
def test_finite_for_log_ratios_pm50(dtype, token_clip, scope):
    g = torch.Generator().manual_seed(6)
    B, T = 4, 16
    old = -torch.rand(B, T, generator=g, dtype=F64) * 60
    log_r = (torch.rand(B, T, generator=g, dtype=F64) * 100 - 50).to(dtype)
    log_r[0] = -50.0  # R ~ e^-50 on most tokens while single tokens sit at +50:
    log_r[1] = -50.0
    log_r[2, 0] = 50.0  # log rho = 50 + log C ~ 100 > MAX_LOG_RHO (would be inf in float32)
    mask = torch.ones(B, T, dtype=dtype)
    mask[3] = 0
    adv = torch.tensor([1.0, -1.0, -2.0, 0.5], dtype=dtype)
    logp = (old.to(dtype) + log_r).requires_grad_(True)
    kw = dict(EPS, token_clip=token_clip)
    if scope == "global":
        kw.update(log_ratio_sum=(log_r * mask).sum().detach() * 3, token_count=mask.sum() * 3)
        kw.update(coupling_sum=torch.tensor(-5.0, dtype=dtype))
    out = echo_loss(logp, old.to(dtype), adv, mask, **kw)
    loss = (out.per_token_loss * mask).sum() / mask.sum()
    loss.backward()
    assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(loss)
    assert torch.isfinite(logp.grad).all()
    assert torch.isfinite(out.metrics["echo/batch_ratio"])
    assert MAX_LOG_RHO < 99


@pytest.mark.parametrize("token_clip", [True, False])
def test_all_empty_mask_is_zero_and_finite(token_clip):
    logp, old, adv, _ = make_inputs(7)
    mask = torch.zeros_like(logp)
    logp[0, 0] = float("-inf")  # garbage at padding must not leak
    out, loss, grad = run_echo(logp, old, adv, mask, **EPS, token_clip=token_clip)
    assert loss.item() == 0.0 and torch.isfinite(out.per_token_loss).all()
    assert (out.per_token_loss == 0).all() and (grad == 0).all()
    for key in ("echo/batch_ratio", "echo/batch_clipped", "clip_ratio/low", "clip_ratio/region"):
        assert torch.isnan(reduce_metrics(out.metrics, mask)[key])  # undefined on this micro-batch


def test_empty_rows_get_zero_loss_and_gradient():
    logp, old, adv, mask = make_inputs(8)
    out, loss, grad = run_echo(logp, old, adv, mask, **EPS)
    assert (out.per_token_loss[3] == 0).all() and (grad[3] == 0).all()
    assert (out.per_token_loss[2, 2:4] == 0).all() and (grad[2, 2:4] == 0).all()
    assert torch.isfinite(grad).all() and torch.isfinite(loss)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_inputs_compute_in_float32(half):
    logp, old, adv, mask = make_inputs(9, shift=0.2, dtype=half)
    out, loss, grad = run_echo(logp, old, adv, mask, **EPS)
    assert out.per_token_loss.dtype == torch.float32
    assert grad.dtype == half and torch.isfinite(grad.float()).all()
    ref, ref_loss, ref_grad = run_echo(logp.float(), old.float(), adv.float(), mask.float(), **EPS)
    torch.testing.assert_close(out.per_token_loss, ref.per_token_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.float(), ref_grad.to(half).float(), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------------------------
def test_input_validation():
    logp, old, adv, mask = make_inputs(10)
    # the clip widths' rule is `ECHOConfig`'s, checked once (tests/trainers/test_validation.py), not per loss call
    with pytest.raises(ValueError, match="old_per_token_logps"):
        echo_loss(logp, old[:, :-1], adv, mask, **EPS)
    with pytest.raises(ValueError, match="advantages"):
        echo_loss(logp, old, adv[:-1], mask, **EPS)
    with pytest.raises(ValueError, match="advantages"):
        echo_loss(logp, old, torch.zeros(5, 3, dtype=F64), mask, **EPS)
    with pytest.raises(ValueError, match="mask"):
        echo_loss(logp, old, adv, mask[:, :3], **EPS)
    with pytest.raises(ValueError, match="together"):
        echo_loss(logp, old, adv, mask, **EPS, log_ratio_sum=torch.tensor(0.0))
    with pytest.raises(ValueError, match="coupling_sum"):
        echo_loss(logp, old, adv, mask, **EPS, coupling_sum=torch.tensor(0.0))
    with pytest.raises(ValueError, match=r"importance_weights must be \(5, 7\) or \(5, 1\)"):
        echo_loss(logp, old, adv, mask, **EPS, importance_weights=torch.ones(5))
