"""Tests for DFPO (arXiv:2604.13088, App. A-D, H, K; docs/dfpo.md).

References are independent of the implementation: plain Python loops in float64 over sequences,
tokens and groups; the transforms are re-derived from the paper's formulas group by group
(``orth_proj``: Eq. 52-55 with the corrected beta and the documented floor guard;
``orth_proj_qp``: scipy's SLSQP on Eq. 51). Gradients are taken by autograd w.r.t.
``per_token_logps`` and aggregated as TRL's ``loss_type="grpo"`` (mean over sequences of the
masked per-sequence mean). Tolerances: 1e-10 (float64 vs float64 reference), 1e-6 vs scipy.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from tests.objectives.dfpo_logged import dfpo_logged as dfpo_loss
from tests.objectives.groups import groups_of
from tests.objectives.metrics import reduce_metrics
from trl_groupopt.core.common import Groups
from trl_groupopt.methods.dfpo.grpo_fix import symmetric_clip_loss
from trl_groupopt.methods.dfpo.objective import TRANSFORMS, group_transform

FLOOR = 1e-6


# ---------------------------------------------------------------------------------------------
# references (float64, loops)
# ---------------------------------------------------------------------------------------------


def grpo_aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL loss_type="grpo": mean over sequences of (loss * mask).sum(-1) / mask.sum(-1)."""
    mask = mask.to(per_token_loss.dtype)
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def ref_orth_proj(s: list[float], a: list[float], floor: float = FLOOR) -> list[float]:
    """Eq. 52-55 for one group, beta = sum_P A s+ / sum_N (-A) s+, plus the floor guard."""
    sp = [max(x, floor) for x in s]
    pos_idx = [i for i in range(len(a)) if a[i] > 0]
    neg_idx = [i for i in range(len(a)) if a[i] < 0]
    pos = sum(a[i] * sp[i] for i in pos_idx)
    neg = sum(-a[i] * sp[i] for i in neg_idx)
    delta = pos - neg
    out = list(sp)
    if delta > 0:
        alpha = neg / pos
        for i in pos_idx:
            out[i] = alpha * sp[i]
        if neg_idx and alpha * min(sp[i] for i in pos_idx) < floor:
            k = floor / min(sp[i] for i in pos_idx)
            for i in pos_idx:
                out[i] = k * sp[i]
            for i in neg_idx:
                out[i] = sp[i] * k * pos / neg
    elif delta < 0:
        beta = pos / neg
        for i in neg_idx:
            out[i] = beta * sp[i]
        if pos_idx and beta * min(sp[i] for i in neg_idx) < floor:
            k = floor / min(sp[i] for i in neg_idx)
            for i in neg_idx:
                out[i] = k * sp[i]
            for i in pos_idx:
                out[i] = sp[i] * k * neg / pos
    if pos_idx and neg_idx or not (pos_idx or neg_idx):
        out = [max(x, floor) for x in out]
    return out


def scipy_qp(s: list[float], a: list[float]) -> np.ndarray:
    """Eq. 51 by SLSQP: argmin 1/2 ||v - s||^2 s.t. a.v = 0, v >= 0."""
    s_np, a_np = np.asarray(s, dtype=np.float64), np.asarray(a, dtype=np.float64)
    if not np.any(a_np != 0):
        return s_np.copy()
    res = minimize(
        lambda v: 0.5 * np.sum((v - s_np) ** 2),
        s_np.copy(),
        jac=lambda v: v - s_np,
        constraints=[{"type": "eq", "fun": lambda v: a_np @ v, "jac": lambda v: a_np}],
        bounds=[(0.0, None)] * len(s),
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 500},
    )
    assert res.success, res.message
    return res.x


def ref_transform(s: list[float], a: list[float], method: str) -> list[float]:
    if method == "none":
        return list(s)
    if method == "min_replace":  # Eq. 50; a group without both advantage signs: 0 where A != 0 (docs/dfpo.md)
        both = any(x > 0 for x in a) and any(x < 0 for x in a)
        return [min(s) if both or x == 0 else 0.0 for x in a]
    if method == "orth_proj":
        return ref_orth_proj(s, a)
    if method == "orth_proj_qp":
        return [float(x) for x in scipy_qp(s, a)]
    raise AssertionError(method)


def ref_group_transform(s: list[float], a: list[float], gids: list[int], method: str) -> list[float]:
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(gids):
        members[g].append(i)
    out = [0.0] * len(s)
    for idx in members.values():
        res = ref_transform([s[i] for i in idx], [a[i] for i in idx], method)
        for i, v in zip(idx, res):
            out[i] = v
    return out


def ref_dfpo(logp, old, adv, mask, gids, method, eps_low, eps_high):
    """Loop reference. Returns (per-seq loss values, grad of the grpo-aggregated loss, s_bar, s_til)."""
    logp = logp.detach().clone().requires_grad_(True)
    batch, length = logp.shape
    s_bar_t, s_bar_v = [], []
    for i in range(batch):
        total, n = logp.new_zeros(()), 0
        for t in range(length):
            if mask[i, t]:
                total = total + (logp[i, t] - old[i, t])
                n += 1
        s_i = torch.exp(total / max(n, 1))  # Eq. 44
        c_i = min(max(s_i.item(), 1 - eps_low), 1 + eps_high)  # Eq. 46
        a_i = float(adv[i])
        chosen = min(s_i.item(), c_i) if a_i >= 0 else max(s_i.item(), c_i)  # Eq. 47
        # the branch that is the clip bound is a constant (no gradient)
        sb = s_i if chosen == s_i.item() else logp.new_tensor(c_i)
        s_bar_t.append(sb)
        s_bar_v.append(sb.item())
    # a row without valid tokens carries no loss and is left out of its group (s_til = 0, "none": unchanged)
    present = [i for i in range(batch) if mask[i].sum() > 0]
    s_til = [s_bar_v[i] if method == "none" else 0.0 for i in range(batch)]
    sub = ref_group_transform(
        [s_bar_v[i] for i in present], [float(adv[i]) for i in present], [int(gids[i]) for i in present], method
    )
    for i, v in zip(present, sub):
        s_til[i] = v
    losses = [-float(adv[i]) * (s_til[i] / s_bar_v[i]) * s_bar_t[i] for i in range(batch)]
    total = sum(losses[i] for i in range(batch) if mask[i].sum() > 0) / batch
    total.backward()
    return [x.item() for x in losses], logp.grad.clone(), s_bar_v, s_til


def pop_var(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def ref_asym(w: list[float], a: list[float], gids: list[int]) -> float:
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(gids):
        members[g].append(i)
    return sum(pop_var([w[i] * a[i] for i in idx]) for idx in members.values()) / len(members)


# ---------------------------------------------------------------------------------------------
# random inputs
# ---------------------------------------------------------------------------------------------


def make_batch(seed: int, num_groups: int, size: int, length: int = 6, spread: float = 0.3, centred: bool = True):
    """`num_groups` consecutive groups of `size` (the trainer's layout), by arbitrary ids, with ragged masks."""
    gen = torch.Generator().manual_seed(seed)
    batch = num_groups * size
    gids = 1000 - 37 * torch.arange(num_groups).repeat_interleave(size)  # arbitrary, negative for large k
    rewards = torch.randint(0, 3, (batch,), generator=gen).to(torch.float64)
    adv = rewards.clone()
    if centred:
        for g in gids.unique():
            sel = gids == g
            adv[sel] = rewards[sel] - rewards[sel].mean()
    else:
        adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    return logp, old, adv, mask, gids


# ---------------------------------------------------------------------------------------------
# App. A.2 toy (Eq. 32-38)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", TRANSFORMS)
def test_toy_shared_prefix_gradient(method):
    """G=2, T=3, shared first two tokens (ratios rho1, rho2), different last token (lam1, lam2).

    Eq. 38: the shared-token coefficient is A1 s1 + A2 s2 = A rho1 rho2 (lam2 - lam1) with the toy's
    s_i = prod_t r_it (Eq. 37). GSPO normalises by length (Eq. 44): s_i = (rho1 rho2 lam_i)^(1/3),
    i.e. Eq. 37 with every ratio taken to the power 1/|y| = 1/3. The loss is -1/G sum_i A_i s_i
    (grpo aggregation), and d s_i / d logp_it = s_i / |y_i|, so summed over the two sequences
    (the same token parameters) d loss / d logp_shared = -(1/(G |y|)) A rho1' rho2' (lam2' - lam1')
    with x' = x^(1/3). Under min_replace / orth_proj / orth_proj_qp it is 0 (sum_i A_i s_til_i = 0).
    """
    rho1, rho2, lam1, lam2, big_a = 1.05, 0.97, 1.10, 0.90, 0.8
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor(
        [[math.log(rho1), math.log(rho2), math.log(lam1)], [math.log(rho1), math.log(rho2), math.log(lam2)]],
        dtype=torch.float64,
        requires_grad=True,
    )
    adv = torch.tensor([-big_a, big_a], dtype=torch.float64)  # Eq. 32: A2 = -A1 = A > 0
    mask = torch.ones(2, 3, dtype=torch.float64)
    gids = torch.tensor([7, 7])
    out = dfpo_loss(logp, old, adv, mask, groups_of(gids), transform=method, epsilon_low=0.2, epsilon_high=0.2)
    grpo_aggregate(out.per_token_loss, mask).backward()
    shared = logp.grad[:, :2].sum(0)  # (2,) summed over the two sequences

    g, length, c = 2, 3, 1.0 / 3.0
    paper = big_a * rho1**c * rho2**c * (lam2**c - lam1**c)  # Eq. 38 with x -> x^(1/|y|)
    if method == "none":
        expected = -paper / (g * length)
        assert abs(paper) > 1e-3  # the toy is non-degenerate
        torch.testing.assert_close(shared, torch.full((2,), expected, dtype=torch.float64), rtol=1e-12, atol=0)
    else:
        torch.testing.assert_close(shared, torch.zeros(2, dtype=torch.float64), rtol=0, atol=1e-15)
    # the reward-related last token still learns (the transform does not zero the gradient)
    assert logp.grad[0, 2] > 1e-3 and logp.grad[1, 2] < -1e-3


# ---------------------------------------------------------------------------------------------
# group_transform
# ---------------------------------------------------------------------------------------------


def random_groups(seed: int, num_groups: int, size: int, kinds=("mixed", "pos", "neg", "zero", "centred")):
    """`num_groups` consecutive groups of `size` (the trainer's layout), of each kind in turn."""
    rng = random.Random(seed)
    s, a, gids, kind_of = [], [], [], []
    for k in range(num_groups):
        kind, n, gid = kinds[k % len(kinds)], size, k
        ss = [math.exp(rng.gauss(0, 0.6)) for _ in range(n)]
        if rng.random() < 0.2:  # some weights under the floor
            ss[rng.randrange(n)] = 10 ** rng.uniform(-9, -6.5)
        if kind == "mixed":
            aa = [rng.gauss(0, 1) for _ in range(n)]
            aa[0], aa[1] = abs(aa[0]) + 0.1, -abs(aa[1]) - 0.1
        elif kind == "pos":
            aa = [abs(rng.gauss(0, 1)) * (rng.random() < 0.8) for _ in range(n)]
            aa[0] = abs(aa[0]) + 0.1
        elif kind == "neg":
            aa = [-abs(rng.gauss(0, 1)) * (rng.random() < 0.8) for _ in range(n)]
            aa[0] = -abs(aa[0]) - 0.1
        elif kind == "zero":
            aa = [0.0] * n
        else:
            r = [float(rng.randint(0, 1)) for _ in range(n)]
            aa = [x - sum(r) / n for x in r]
        s += ss
        a += aa
        gids += [gid] * n
        kind_of += [kind] * n
    return s, a, gids, kind_of


@pytest.mark.parametrize("size", [2, 5, 8])
def test_orth_proj_orthogonal_and_floored(size):
    s, a, gids, kinds = random_groups(size, 600, size)
    out = group_transform(
        torch.tensor(s, dtype=torch.float64), torch.tensor(a, dtype=torch.float64), groups_of(gids), "orth_proj"
    ).tolist()
    ref = ref_group_transform(s, a, gids, "orth_proj")
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=0)  # Eq. 52-55 (+ guard), group by group

    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(gids):
        members[g].append(i)
    guarded = 0
    for idx in members.values():
        kind = kinds[idx[0]]
        dot = sum(a[i] * out[i] for i in idx)
        scale = sum(abs(a[i]) * out[i] for i in idx) + sum(abs(a[i]) * max(s[i], FLOOR) for i in idx)
        assert abs(dot) <= 1e-6 * scale + 1e-300, (kind, dot, scale)  # sum_i A_i s_til_i = 0
        if kind in ("mixed", "centred", "zero"):
            assert min(out[i] for i in idx) >= FLOOR  # s_til >= floor
        else:  # single sign: the documented behaviour (alpha or beta = 0, as Eq. 54-55 give)
            for i in idx:
                assert out[i] == (0.0 if a[i] != 0 else max(s[i], FLOOR))
        if kind == "zero":  # all-zero advantages: unchanged (up to the floor)
            assert all(out[i] == max(s[i], FLOOR) for i in idx)
        sp = [max(s[i], FLOOR) for i in idx]
        if any(o > p * (1 + 1e-12) for o, p in zip((out[i] for i in idx), sp)):
            guarded += 1  # only the floor guard scales a side up
    assert guarded >= 1  # the random draw exercises the guard


def test_orth_proj_paper_formula_and_guard_example():
    # delta > 0: alpha = sum_N (-A) s / sum_P A s, P scaled, N untouched (Eq. 54-55 as printed)
    s = torch.tensor([1.2, 0.9, 1.0], dtype=torch.float64)
    a = torch.tensor([1.0, 0.5, -1.0], dtype=torch.float64)
    out = group_transform(s, a, groups_of([3, 3, 3]), "orth_proj")
    alpha = 1.0 / (1.2 + 0.45)
    torch.testing.assert_close(out, torch.tensor([1.2 * alpha, 0.9 * alpha, 1.0], dtype=torch.float64))
    # delta < 0: beta = sum_P A s / sum_N (-A) s (positive; Eq. 55 as printed would be negative)
    a2 = torch.tensor([0.5, -1.0, -1.0], dtype=torch.float64)
    out2 = group_transform(s, a2, groups_of([3, 3, 3]), "orth_proj")
    beta = 0.6 / 1.9
    assert 0 < beta <= 1
    torch.testing.assert_close(out2, torch.tensor([1.2, 0.9 * beta, 1.0 * beta], dtype=torch.float64))
    # guard: alpha = 1e-7 would put P at 1e-7 < floor; P goes to the floor, N is scaled up
    out3 = group_transform(
        torch.tensor([1.0, 1e-9], dtype=torch.float64),
        torch.tensor([10.0, -1.0], dtype=torch.float64),
        groups_of([0, 0]),
        "orth_proj",
    )
    torch.testing.assert_close(out3, torch.tensor([1e-6, 1e-5], dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("size", [2, 4, 6])
def test_orth_proj_qp_matches_scipy_and_is_closer(size):
    s, a, gids, kinds = random_groups(size, 1000, size)
    st, at, gt = torch.tensor(s, dtype=torch.float64), torch.tensor(a, dtype=torch.float64), groups_of(gids)
    qp = group_transform(st, at, gt, "orth_proj_qp").tolist()
    orth = group_transform(st, at, gt, "orth_proj").tolist()
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(gids):
        members[g].append(i)
    assert len(members) == 1000
    for idx in members.values():
        ref = scipy_qp([s[i] for i in idx], [a[i] for i in idx])
        got = np.array([qp[i] for i in idx])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
        assert got.min() >= 0
        assert abs(sum(a[i] * qp[i] for i in idx)) <= 1e-12 * (1 + sum(abs(a[i]) * qp[i] for i in idx))
        dist_qp = math.dist([qp[i] for i in idx], [s[i] for i in idx])
        dist_orth = math.dist([orth[i] for i in idx], [s[i] for i in idx])
        assert dist_qp <= dist_orth + 1e-9  # orth_proj is feasible for Eq. 51, so never closer


@pytest.mark.parametrize("size", [3, 16])
def test_orth_proj_qp_exact_kkt_float32(size):
    # float32 inputs: still exact to float32 rounding, and the KKT structure holds
    s, a, gids, _ = random_groups(2, 200, size, kinds=("mixed", "centred"))
    st, at = torch.tensor(s, dtype=torch.float32), torch.tensor(a, dtype=torch.float32)
    v = group_transform(st, at, groups_of(gids), "orth_proj_qp")
    assert v.dtype == torch.float32
    v64 = group_transform(st.double(), at.double(), groups_of(gids), "orth_proj_qp")
    torch.testing.assert_close(v.double(), v64, rtol=1e-5, atol=1e-6)


def test_group_transform_min_replace_none_and_detached():
    s = torch.tensor([1.1, 0.8, 1.3, 0.95, 1.0, 1.2], dtype=torch.float64, requires_grad=True)
    a = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0], dtype=torch.float64)
    g = Groups.contiguous(6, 2)
    for method in TRANSFORMS:
        out = group_transform(s, a, g, method)
        assert not out.requires_grad and out.shape == (6,)
    torch.testing.assert_close(
        group_transform(s, a, g, "min_replace"),
        torch.tensor([0.8, 0.8, 0.95, 0.95, 1.0, 1.0], dtype=torch.float64),
    )
    torch.testing.assert_close(group_transform(s, a, g, "none"), s.detach())
    with pytest.raises(ValueError, match="min_replace"):
        group_transform(s, a, g, "minreplace")
    with pytest.raises(ValueError):
        group_transform(s, a[:3], g, "none")
    with pytest.raises(ValueError, match="cover 4 rows"):
        group_transform(s, a, Groups.contiguous(4, 2), "min_replace")


# ---------------------------------------------------------------------------------------------
# dfpo_loss
# ---------------------------------------------------------------------------------------------


def trl_gspo(logp, old, adv, mask, eps_low, eps_high):
    """TRL 1.16's sequence-level clipped surrogate, written out (grpo_trainer._compute_loss)."""
    log_ratio = logp - old
    log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    coef_1 = torch.exp(log_importance_weights.unsqueeze(-1))
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    advantages = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    return per_token_loss, grpo_aggregate(per_token_loss, mask)


@pytest.mark.parametrize("adv_shape", ["B", "BT"])
def test_none_equals_trl_gspo(adv_shape):
    logp, old, adv, mask, gids = make_batch(3, 4, 4, spread=0.5)
    eps_low, eps_high = 0.2, 0.28
    lp_ref = logp.clone().requires_grad_(True)
    ref_ptl, ref_total = trl_gspo(lp_ref, old, adv, mask, eps_low, eps_high)
    ref_total.backward()
    lp = logp.clone().requires_grad_(True)
    a_in = adv if adv_shape == "B" else adv.unsqueeze(1).expand_as(logp)
    out = dfpo_loss(lp, old, a_in, mask, groups_of(gids), transform="none", epsilon_low=eps_low, epsilon_high=eps_high)
    total = grpo_aggregate(out.per_token_loss, mask)
    total.backward()
    assert out.per_token_loss.shape == (logp.shape[0], 1)
    torch.testing.assert_close(out.per_token_loss, ref_ptl, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(total, ref_total, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lp.grad, lp_ref.grad, rtol=1e-10, atol=1e-14)
    # the draw has clipped sequences on both sides and the TRL clip metrics agree
    coef = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    low = ((coef < 1 - eps_low) & (adv < 0)).double().mean()
    high = ((coef > 1 + eps_high) & (adv > 0)).double().mean()
    assert low > 0 and high > 0
    # (B, 1) indicators, the ObjectiveOutput contract, reduced over sequences as TRL does
    assert out.metrics["clip_ratio/low"].shape == (logp.shape[0], 1)
    reduced = reduce_metrics(out.metrics, mask)
    assert reduced["clip_ratio/low"].item() == pytest.approx(low.item())
    assert reduced["clip_ratio/high"].item() == pytest.approx(high.item())
    assert reduced["clip_ratio/region"].item() == pytest.approx((low + high).item())


@pytest.mark.parametrize("method", TRANSFORMS)
def test_loop_reference_loss_grad_metrics(method):
    logp, old, adv, mask, gids = make_batch(10 + TRANSFORMS.index(method), 6, 3, spread=0.4)
    mask[2] = 0.0  # a row with no valid token
    eps_low, eps_high = 0.2, 0.25
    ref_loss, ref_grad, s_bar, s_til = ref_dfpo(logp, old, adv, mask, gids, method, eps_low, eps_high)
    lp = logp.clone().requires_grad_(True)
    out = dfpo_loss(lp, old, adv, mask, groups_of(gids), transform=method, epsilon_low=eps_low, epsilon_high=eps_high)
    grpo_aggregate(out.per_token_loss, mask).backward()
    tol = 1e-10 if method != "orth_proj_qp" else 1e-7  # scipy reference: 1e-7
    np.testing.assert_allclose(out.per_token_loss.squeeze(1).tolist(), ref_loss, rtol=tol, atol=tol)
    torch.testing.assert_close(lp.grad, ref_grad, rtol=tol, atol=tol)

    a, g = adv.tolist(), gids.tolist()
    assert out.metrics["dfpo/asym_before"].item() == pytest.approx(ref_asym(s_bar, a, g), rel=1e-6)
    assert out.metrics["dfpo/asym_after"].item() == pytest.approx(ref_asym(s_til, a, g), rel=1e-6, abs=1e-9)
    # shrink: over the present members of groups with both advantage signs
    members: dict[int, list[int]] = defaultdict(list)
    for i, gid in enumerate(g):
        if mask[i].sum() > 0:
            members[gid].append(i)
    rows = [i for idx in members.values() if min(a[j] for j in idx) < 0 < max(a[j] for j in idx) for i in idx]
    shrink = sum(s_til[i] / s_bar[i] for i in rows) / len(rows)
    assert out.metrics["dfpo/shrink"].item() == pytest.approx(shrink, rel=1e-6)
    for name, v in out.metrics.items():
        assert v.dtype == torch.float32 and not v.requires_grad
        assert v.shape == ((len(a), 1) if name.startswith("clip_ratio/") else ()), name
    if method == "min_replace":
        assert out.metrics["dfpo/asym_after"] < out.metrics["dfpo/asym_before"]
        assert out.metrics["dfpo/shrink"] < 1


@pytest.mark.parametrize("method", TRANSFORMS)
def test_clipped_sequences_get_no_gradient_and_s_til_is_constant(method):
    eps_low, eps_high = 0.2, 0.2
    length = 4
    # per-sequence mean log-ratio; A signs chosen so rows 0 (A>0, s>1.2) and 1 (A<0, s<0.8) are
    # clipped, rows 2 (A>0, s<0.8) and 3 (A<0, s>1.2) are outside the clip range but not clipped
    means = [0.5, -0.5, -0.4, 0.4, 0.05, -0.03, 0.1, 0.0]
    adv = torch.tensor([1.0, -1.0, 0.7, -0.6, 0.3, -0.4, 1.2, -1.2], dtype=torch.float64)
    gids = torch.tensor([1, 1, 1, 1, 2, 2, 2, 2])
    gen = torch.Generator().manual_seed(5)
    noise = 0.05 * torch.randn(8, length, generator=gen, dtype=torch.float64)
    noise = noise - noise.mean(1, keepdim=True)
    old = -torch.rand(8, length, generator=gen, dtype=torch.float64)
    logp = (old + torch.tensor(means, dtype=torch.float64).unsqueeze(1) + noise).requires_grad_(True)
    mask = torch.ones(8, length, dtype=torch.float64)
    out = dfpo_loss(
        logp, old, adv, mask, groups_of(gids), transform=method, epsilon_low=eps_low, epsilon_high=eps_high
    )
    grpo_aggregate(out.per_token_loss, mask).backward()

    s = torch.exp(torch.tensor(means, dtype=torch.float64))
    clipped = torch.tensor([True, True, False, False, False, False, False, False])
    bounds = torch.where(
        adv > 0, torch.tensor(1 + eps_high, dtype=torch.float64), torch.tensor(1 - eps_low, dtype=torch.float64)
    )
    s_bar = torch.where(clipped, bounds, s)
    s_bar_req = s_bar.clone().requires_grad_(True)
    s_til = group_transform(s_bar_req, adv, groups_of(gids), method)
    assert not s_til.requires_grad
    assert torch.all(logp.grad[clipped] == 0)
    # unclipped: grad_it = -A_i s_til_i (1/|y_i|) / B (s_til a constant, App. D stop-gradient)
    expected = -(adv * s_til).unsqueeze(1) / length / 8 * torch.ones(8, length, dtype=torch.float64)
    torch.testing.assert_close(logp.grad[~clipped], expected[~clipped], rtol=1e-10, atol=1e-14)
    assert torch.all(logp.grad[~clipped].abs() > 0) or method == "orth_proj_qp"
    assert reduce_metrics(out.metrics, mask)["clip_ratio/region"].item() == pytest.approx(2 / 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [2, 16])
@pytest.mark.parametrize("method", TRANSFORMS)
def test_degenerate_inputs_are_finite(method, group_size, dtype):
    gen = torch.Generator().manual_seed(group_size)
    batch, length = 2 * group_size, 5
    gids = torch.arange(batch) // group_size * 11 - 4
    # group 0: all-equal rewards (A = 0); group 1: centred 0/1 rewards
    adv = torch.zeros(batch)
    adv[group_size:] = torch.tensor([1.0, 0.0] * (group_size // 2)) - 0.5
    old = -torch.rand(batch, length, generator=gen) * 5
    log_ratio = torch.empty(batch, length).uniform_(-50, 50, generator=gen)
    logp = (old + log_ratio).to(dtype).requires_grad_(True)
    mask = torch.ones(batch, length)
    mask[0] = 0  # a row with no valid token
    mask[group_size, 2:] = 0
    out = dfpo_loss(
        logp, old.to(dtype), adv.to(dtype), mask, groups_of(gids), transform=method, epsilon_low=0.2, epsilon_high=0.2
    )
    assert out.per_token_loss.dtype == torch.float32
    total = grpo_aggregate(out.per_token_loss, mask)
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(out.per_token_loss).all()
    assert torch.isfinite(logp.grad.float()).all()
    assert torch.all(out.per_token_loss[:group_size] == 0)  # A = 0 contributes nothing
    for name, value in out.metrics.items():  # the residuals are NaN when no group has two moving members
        assert not torch.isinf(value).any() and (
            name in ("dfpo/cancellation_residual", "dfpo/cancellation_residual_gspo") or torch.isfinite(value).all()
        ), name


def test_dfpo_input_validation():
    logp, old, adv, mask, gids = make_batch(0, 2, 2)
    kw = dict(transform="min_replace", epsilon_low=0.2, epsilon_high=0.2)
    # the settings' rules are `DFPOConfig`'s, checked once (tests/trainers/test_validation.py), not per loss call
    with pytest.raises(ValueError):
        dfpo_loss(logp, old[:, :3], adv, mask, groups_of(gids), **kw)
    with pytest.raises(ValueError):
        dfpo_loss(logp, old, adv, mask[:, :3], groups_of(gids), **kw)
    with pytest.raises(ValueError):
        dfpo_loss(logp, old, adv[:3], mask, groups_of(gids), **kw)
    with pytest.raises(ValueError):
        dfpo_loss(logp, old, adv, mask, groups_of(gids[:2]), **kw)
    with pytest.raises(ValueError, match="constant along T"):
        dfpo_loss(logp, old, adv.unsqueeze(1) + torch.randn_like(logp), mask, groups_of(gids), **kw)
    # (B, T) constant along T and (B, 1) are accepted and equal the (B,) result
    base = dfpo_loss(logp, old, adv, mask, groups_of(gids), **kw).per_token_loss
    for a2 in (adv.unsqueeze(1), adv.unsqueeze(1).expand_as(logp)):
        torch.testing.assert_close(dfpo_loss(logp, old, a2, mask, groups_of(gids), **kw).per_token_loss, base)


# ---------------------------------------------------------------------------------------------
# symmetric_clip_loss (GRPO-fix, App. H, Eq. 79-80)
# ---------------------------------------------------------------------------------------------


def ref_symmetric(logp, old, adv_tok, mask, eps_high):
    """Loops: loss_it = -A_it clip(r_it, 0, 1 + eps) and its gradient d/d logp_it (grpo-aggregated)."""
    batch, length = logp.shape
    loss = torch.zeros(batch, length, dtype=torch.float64)
    grad = torch.zeros(batch, length, dtype=torch.float64)
    for i in range(batch):
        n = int(mask[i].sum())
        for t in range(length):
            lr = float(logp[i, t] - old[i, t]) * float(mask[i, t])
            r = math.exp(lr)
            a = float(adv_tok[i, t])
            loss[i, t] = -a * min(max(r, 0.0), 1 + eps_high)
            if mask[i, t] and r < 1 + eps_high:  # d clip / d log p = r inside, 0 above the bound
                grad[i, t] = -a * r / max(n, 1) / batch
    return loss, grad


@pytest.mark.parametrize("adv_shape", ["B", "BT"])
def test_symmetric_clip_loop_reference(adv_shape):
    logp, old, adv, mask, _ = make_batch(22, 3, 4, spread=0.4, centred=False)
    batch, length = logp.shape
    if adv_shape == "B":
        adv_in, adv_tok = adv, adv.unsqueeze(1).expand(batch, length)
    else:
        gen = torch.Generator().manual_seed(4)
        adv_in = adv_tok = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    eps = 0.28
    lp = logp.clone().requires_grad_(True)
    out = symmetric_clip_loss(lp, old, adv_in, mask, epsilon_high=eps)
    grpo_aggregate(out.per_token_loss, mask).backward()
    ref_loss, ref_grad = ref_symmetric(logp, old, adv_tok, mask, eps)
    torch.testing.assert_close(out.per_token_loss * mask, ref_loss * mask, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lp.grad, ref_grad, rtol=1e-10, atol=1e-14)
    # both signs are clipped above, and both signs have unclipped tokens below 1 - eps
    r = torch.exp((logp - old) * mask)
    valid = mask > 0
    for sign in (1, -1):
        side = valid & (adv_tok * sign > 0)
        assert (side & (r > 1 + eps)).any() and (side & (r < 1 - eps)).any()
        assert torch.all(lp.grad[side & (r > 1 + eps)] == 0)
        assert torch.all(lp.grad[side & (r < 1 - eps)] != 0)  # no lower clip for either sign
    n = mask.sum()
    assert reduce_metrics(out.metrics, mask)["clip_ratio/high"].item() == pytest.approx(
        ((r > 1 + eps) & (adv_tok > 0) & valid).sum() / n
    )
    assert out.metrics["dfpo/sym_clip_ratio"].item() == pytest.approx(((r > 1 + eps) & valid).sum() / n)
    assert reduce_metrics(out.metrics, mask)["clip_ratio/low"].item() == 0.0


def test_symmetric_clip_restores_shared_token_cancellation():
    """Corollary H.1 (Eq. 82): shared token, sum A = 0, r outside the clip range -> zero gradient;
    PPO's sign-dependent min (Eq. 75-76) does not cancel."""
    eps = 0.2
    for shared_log_ratio in (0.5, -0.5):  # r = 1.65 > 1 + eps and r = 0.61 < 1 - eps
        old = torch.zeros(2, 2, dtype=torch.float64)
        logp = torch.tensor([[shared_log_ratio, 0.1], [shared_log_ratio, -0.2]], dtype=torch.float64)
        adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
        mask = torch.ones(2, 2, dtype=torch.float64)
        lp = logp.clone().requires_grad_(True)
        grpo_aggregate(symmetric_clip_loss(lp, old, adv, mask, epsilon_high=eps).per_token_loss, mask).backward()
        assert lp.grad[:, 0].sum().abs() < 1e-15
        lp2 = logp.clone().requires_grad_(True)
        r = torch.exp(lp2 - old)
        ppo = -torch.min(r * adv.unsqueeze(1), torch.clamp(r, 1 - eps, 1 + eps) * adv.unsqueeze(1))
        grpo_aggregate(ppo, mask).backward()
        assert lp2.grad[:, 0].sum().abs() > 1e-2


def test_symmetric_clip_edge_cases():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=gen) * 5
    logp = (old + torch.empty(4, 6).uniform_(-50, 50, generator=gen)).to(torch.bfloat16).requires_grad_(True)
    mask = torch.ones(4, 6)
    mask[1] = 0
    adv = torch.tensor([0.0, 1.0, -1.0, 0.5]).to(torch.bfloat16)
    out = symmetric_clip_loss(logp, old.to(torch.bfloat16), adv, mask, epsilon_high=0.2)
    assert out.per_token_loss.dtype == torch.float32
    grpo_aggregate(out.per_token_loss, mask).backward()
    assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(logp.grad.float()).all()
    empty = symmetric_clip_loss(logp, old, adv, torch.zeros(4, 6), epsilon_high=0.2)
    assert torch.isnan(reduce_metrics(empty.metrics, torch.zeros(4, 6))["clip_ratio/high"])
    with pytest.raises(ValueError):
        symmetric_clip_loss(logp, old, adv[:3], mask, epsilon_high=0.2)
    with pytest.raises(ValueError):
        symmetric_clip_loss(logp, old, torch.zeros(4, 5), mask, epsilon_high=0.2)
