"""CTPO objective (arXiv:2605.07331; the authors' `cum-token-cumprod-la` and `cum-token-geomean-la`).

Tolerances: float64 comparisons 1e-12 (loss/gradient vs loops, the authors' loss and surrogates) and 1e-10 (exact
expectations in the tabular problem). The Monte Carlo variance comparison is stated in its test.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests.objectives.metrics import reduce_metrics
from trl_groupopt.methods.ctpo.objective import ctpo_loss

F64 = torch.float64
DEFAULTS = dict(epsilon_low=0.025, epsilon_high=0.05, dual_clip=0.05, position_power=0.5)  # authors' script
WIDE = dict(epsilon_low=1e6, epsilon_high=1e6, dual_clip=1e6)  # "unclipped"


# ----------------------------------------------------------------------------------------------
# Independent float64 loop reference
# ----------------------------------------------------------------------------------------------
def ref_ctpo(logp, old, adv, mask, *, epsilon_low, epsilon_high, dual_clip, position_power):
    """Per-token loss and d loss_t / d logp_t (nested lists) plus counts of the branches taken."""
    logp, old, mask, adv = logp.tolist(), old.tolist(), mask.tolist(), adv.tolist()
    B, T = len(logp), len(logp[0])
    loss = [[0.0] * T for _ in range(B)]
    grad = [[0.0] * T for _ in range(B)]
    branches = dict(free=0, clip_high=0, clip_low=0, dual=0, cap=0)
    for i in range(B):
        cum, t = 0.0, 0
        for k in range(T):
            if mask[i][k] <= 0:
                continue
            t += 1
            cum += min(max(logp[i][k] - old[i][k], -20.0), 20.0)
            A = adv[i] if not isinstance(adv[i], list) else adv[i][k]
            s = max(t, 1) ** position_power
            lr, dlr = (cum, 1.0) if cum <= 10.0 else (10.0, 0.0)
            lo, hi = -epsilon_low * s, epsilon_high * s
            inside = lo <= lr <= hi
            cl = min(max(lr, lo), hi)
            v1, v2 = -A * math.exp(lr), -A * math.exp(cl)
            if v1 >= v2:  # unclipped branch (equal when inside the window)
                value, g = v1, -A * math.exp(lr)
                branches["free"] += 1
            else:
                value, g = v2, (-A * math.exp(cl) if inside else 0.0)
                branches["clip_high" if lr > hi else "clip_low"] += 1
            if A < 0 and value > -A * math.exp(dual_clip * s):
                value, g = -A * math.exp(dual_clip * s), 0.0
                branches["dual"] += 1
            branches["cap"] += dlr == 0.0
            loss[i][k], grad[i][k] = value, g * dlr
    return loss, grad, branches


def make_inputs(seed, B=6, T=14, adv_2d=False, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    logp = old + 0.12 * torch.randn(B, T, generator=g, dtype=F64)
    logp[3] = old[3] + 1.6  # drifts above the cap 10 after 7 tokens
    logp[4, 2] = old[4, 2] - 25.0  # hits the per-token clamp at -20
    logp[5] = old[5] + 0.3 + 0.05 * torch.randn(T, generator=g, dtype=F64)  # above the window for any p <= 1
    mask = torch.ones(B, T, dtype=F64)
    mask[0, 4:7] = 0  # hole (tool tokens) in the middle
    mask[1, 9:] = 0  # shorter row
    mask[2, 1] = 0
    mask[2, 10:] = 0
    adv = (
        torch.randn(B, T, generator=g, dtype=F64)
        if adv_2d
        else torch.tensor([1.2, -0.7, 0.4, -1.5, 0.9, 0.8], dtype=F64)
    )
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def run_ctpo(logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_(True)
    out = ctpo_loss(logp, old, adv, mask, **kw)
    loss = (out.per_token_loss * mask).sum() / mask.sum().clamp(min=1)  # "dapo" aggregation
    loss.backward()
    return out, loss.detach(), logp.grad


@pytest.mark.parametrize("position_power", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("adv_2d", [False, True])
def test_matches_loop_reference(position_power, adv_2d):
    logp, old, adv, mask = make_inputs(1, adv_2d=adv_2d)
    kw = dict(DEFAULTS, position_power=position_power)
    out, loss, grad = run_ctpo(logp, old, adv, mask, **kw)
    ref_loss, ref_grad, branches = ref_ctpo(logp, old, adv, mask, **kw)
    n = mask.sum()
    torch.testing.assert_close(out.per_token_loss, torch.tensor(ref_loss, dtype=F64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=F64) * mask / n, rtol=1e-12, atol=1e-12)
    assert loss.item() == pytest.approx((torch.tensor(ref_loss, dtype=F64) * mask).sum().item() / n.item(), rel=1e-12)
    assert all(v > 0 for v in branches.values()), branches  # every branch is exercised


def authors_la_loss(old, logp, adv, mask, *, la_clip_low, la_clip_high, la_clip_c, la_power, ratio_mode):
    """float64 port of `_compute_policy_loss_cum_token_la_impl` (github.com/horizon-llm/CTPO, verl's
    core_algos.py) with `loss_agg_mode="token-mean"` and no rollout IS weights; `adv` is (B, T) as in verl."""
    log_r = torch.clamp(logp - old, min=-20.0, max=20.0)
    cumulative_sum = torch.cumsum(log_r * mask, dim=-1)
    if ratio_mode == "geomean":
        cumulative_count = torch.cumsum(mask, dim=-1).clamp(min=1.0)
        kl_values = torch.where(mask > 0, cumulative_sum / cumulative_count, torch.zeros_like(cumulative_sum))
    else:
        kl_values = torch.where(mask > 0, cumulative_sum, torch.zeros_like(cumulative_sum))
    log_ratio = torch.clamp(kl_values.detach() + logp - logp.detach(), max=10.0)
    ratio = torch.where(mask > 0, torch.exp(log_ratio), torch.zeros_like(log_ratio))
    pos_t = torch.cumsum(mask, dim=-1)
    scale = pos_t.clamp(min=1.0).pow(la_power) if la_power != 0.0 else torch.ones_like(pos_t)
    clipped = torch.clamp(log_ratio, -la_clip_low * scale, la_clip_high * scale)
    clipped_ratio = torch.where(mask > 0, torch.exp(clipped), torch.zeros_like(clipped))
    dual = torch.where(mask > 0, torch.exp(la_clip_c * scale), torch.ones_like(scale))
    clip1 = torch.maximum(-adv * ratio, -adv * clipped_ratio)
    losses = torch.where(adv < 0, torch.min(-adv * dual, clip1), clip1)
    return (losses * mask).sum() / mask.sum()


@pytest.mark.parametrize(
    "ratio_mode,position_power", [("cumprod", 0.5), ("cumprod", 0.0), ("geomean", -0.5), ("geomean", 0.5)]
)
@pytest.mark.parametrize("adv_2d", [False, True])
def test_matches_the_authors_loss(ratio_mode, position_power, adv_2d):
    """Loss and gradient equal the authors' length-adaptive loss in both ratio modes (masks with holes, the -20/20
    clamp, the cap at 10, both clips and the dual clip exercised by `make_inputs`)."""
    logp, old, adv, mask = make_inputs(9, adv_2d=adv_2d)
    kw = dict(DEFAULTS, position_power=position_power, ratio_mode=ratio_mode)
    out, loss, grad = run_ctpo(logp, old, adv, mask, **kw)
    x = logp.clone().requires_grad_(True)
    ref = authors_la_loss(
        old,
        x,
        adv.unsqueeze(1).expand_as(x) if adv.dim() == 1 else adv,
        mask,
        la_clip_low=0.025,
        la_clip_high=0.05,
        la_clip_c=0.05,
        la_power=position_power,
        ratio_mode=ratio_mode,
    )
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, x.grad, rtol=1e-12, atol=1e-12)
    assert (x.grad != 0).sum() > 10  # a real gradient: not every token clipped
    assert out.metrics["clip_ratio/region"].sum() > 0  # and some tokens are


def test_geomean_is_the_running_mean_of_the_clamped_log_ratios():
    """geomean's L_t is the cumulative (clamped) log-ratio over the count of valid tokens so far: the metric
    `ctpo/abs_cum_log_ratio/t<=16` reports it, and on-policy both modes are token-level GRPO."""
    logp, old, adv, mask = make_inputs(10)
    kw = dict(WIDE, position_power=0.0)
    cum = ctpo_loss(logp, old, adv, mask, **kw).metrics["ctpo/abs_cum_log_ratio/t<=16"]
    geo = ctpo_loss(logp, old, adv, mask, **kw, ratio_mode="geomean").metrics["ctpo/abs_cum_log_ratio/t<=16"]
    step = torch.where(mask > 0, (logp - old).clamp(-20, 20), torch.zeros_like(logp))
    t = mask.cumsum(-1).clamp(min=1)
    valid = mask > 0
    assert cum.item() == pytest.approx(step.cumsum(-1)[valid].abs().mean().item(), rel=1e-6)
    assert geo.item() == pytest.approx((step.cumsum(-1) / t)[valid].abs().mean().item(), rel=1e-6)
    same = logp.detach().clone()
    a = run_ctpo(logp, same, adv, mask, **DEFAULTS)[1:]
    b = run_ctpo(logp, same, adv, mask, **dict(DEFAULTS, position_power=-0.5, ratio_mode="geomean"))[1:]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_prefix_stop_gradient():
    """d loss_t / d logp_j = 0 for j != t (in particular j < t), nonzero at j = t."""
    logp, old, adv, mask = make_inputs(2, T=8, adv_2d=True)
    logp = logp.clone().requires_grad_(True)
    for kw in (DEFAULTS, dict(WIDE, position_power=0.5)):
        out = ctpo_loss(logp, old, adv, mask, **kw)
        for i in range(3):  # rows with holes and different lengths
            for t in range(8):
                (g,) = torch.autograd.grad(out.per_token_loss[i, t], logp, retain_graph=True)
                others = g.clone()
                others[i, t] = 0
                assert (others == 0).all()
                if kw is not DEFAULTS and mask[i, t] > 0:  # unclipped: the token's own gradient is there
                    assert g[i, t].abs() > 0
    # the cumulative value still depends on the prefix: the loss at t changes when logp_j, j < t, does
    bumped = logp.detach().clone()
    bumped[0, 0] += 0.1
    a = ctpo_loss(logp.detach(), old, adv, mask, **WIDE, position_power=0.5).per_token_loss
    b = ctpo_loss(bumped, old, adv, mask, **WIDE, position_power=0.5).per_token_loss
    later = mask[0, 1:] > 0
    assert (a[0, 1:] - b[0, 1:])[later].abs().min() > 0


def trl_token_grpo(logp, old, adv, mask, epsilon_low, epsilon_high):
    """TRL 1.16 GRPOTrainer._compute_loss, token level, loss_type="dapo" (single process)."""
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


@pytest.mark.parametrize("adv_2d", [False, True])
@pytest.mark.parametrize("kw", [DEFAULTS, dict(DEFAULTS, position_power=0.0), dict(WIDE, position_power=1.0)])
def test_on_policy_equals_trl_token_grpo(adv_2d, kw):
    logp, _, adv, mask = make_inputs(3, adv_2d=adv_2d)
    old = logp.detach().clone()
    _, loss, grad = run_ctpo(logp, old, adv, mask, **kw)
    x = logp.clone().requires_grad_(True)
    trl_loss = trl_token_grpo(x, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28)
    trl_loss.backward()
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, x.grad, rtol=1e-12, atol=1e-12)


def test_power_zero_is_plain_cumulative_clip():
    """p = 0: constant log-space window; equals the authors' ratio-space `cum-token-cumprod` loss
    (clip [1 - 0.2, 1 + 0.28], dual-clip c = 3) under eps_low = -log 0.8, eps_high = log 1.28, eps_c = log 3."""
    logp, old, adv, mask = make_inputs(4, adv_2d=True)
    kw = dict(epsilon_low=-math.log(0.8), epsilon_high=math.log(1.28), dual_clip=math.log(3.0), position_power=0.0)
    out, loss, grad = run_ctpo(logp, old, adv, mask, **kw)

    x = logp.clone().requires_grad_(True)
    valid = mask > 0
    cum = torch.where(valid, ((x.detach() - old).clamp(-20, 20) * mask).cumsum(-1), torch.zeros_like(x))
    ratio = torch.exp(torch.clamp(cum + x - x.detach(), max=10.0))
    pg1, pg2 = -adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.28)
    clip1 = torch.maximum(pg1, pg2)
    ref = torch.where(adv < 0, torch.min(-adv * 3.0, clip1), clip1)
    ref_loss = (ref * mask).sum() / mask.sum()
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    torch.testing.assert_close(grad, x.grad, rtol=1e-12, atol=1e-12)
    assert (
        reduce_metrics(out.metrics, mask)["clip_ratio/region"].item() > 0 and out.metrics["ctpo/dual_clip"].item() > 0
    )
    # the window does not move with t: the same log-ratio is clipped identically at t=1 and late
    early = ctpo_loss(
        torch.tensor([[0.3, 0.0]], dtype=F64),
        torch.zeros(1, 2, dtype=F64),
        torch.ones(1, dtype=F64),
        torch.ones(1, 2, dtype=F64),
        **kw,
    ).per_token_loss[0, 0]
    late = ctpo_loss(
        torch.tensor([[0.0] * 50 + [0.3]], dtype=F64),
        torch.zeros(1, 51, dtype=F64),
        torch.ones(1, dtype=F64),
        torch.ones(1, 51, dtype=F64),
        **kw,
    ).per_token_loss[0, -1]
    assert early.item() == pytest.approx(late.item(), rel=1e-14) == -1.28


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_are_finite(dtype):
    T = 32768
    g = torch.Generator().manual_seed(5)
    signs = torch.randint(0, 2, (T,), generator=g).to(F64) * 2 - 1
    steps = torch.stack(
        [0.5 * signs, torch.full((T,), 0.5, dtype=F64), torch.full((T,), -0.5, dtype=F64), 0.5 * signs]
    )  # random walk, all up, all down
    old = -torch.rand(4, T, generator=g, dtype=F64) * 5
    logp = (old + steps).to(dtype).requires_grad_(True)
    mask = torch.ones(4, T, dtype=dtype)
    mask[0, 100:200] = 0
    mask[1, T // 2 :] = 0
    adv = torch.tensor([1.0, -1.0, -0.5, 0.0], dtype=dtype)  # A = 0 row: no 0 * inf in the dual clip
    for kw in (DEFAULTS, dict(epsilon_low=1.0, epsilon_high=1.0, dual_clip=1.0, position_power=0.5)):
        out = ctpo_loss(logp, old.to(dtype), adv, mask, **kw)
        loss = (out.per_token_loss * mask).sum() / mask.sum()
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(loss)
        assert torch.isfinite(grad.float()).all() and grad.dtype == dtype
        assert out.per_token_loss.dtype == torch.float32
        assert all(torch.isfinite(v) for v in reduce_metrics(out.metrics, mask).values())


def test_metrics_match_loop():
    g = torch.Generator().manual_seed(6)
    B, T = 3, 300
    old = -torch.rand(B, T, generator=g, dtype=F64)
    logp = old + 0.05 * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.ones(B, T, dtype=F64)
    mask[0, 10:40] = 0  # hole: position counter t does not advance
    mask[2, 200:] = 0
    adv = torch.randn(B, T, generator=g, dtype=F64)
    out = ctpo_loss(logp, old, adv, mask, **DEFAULTS)
    counts = dict(low=0, high=0, dual=0, n=0)
    buckets = {"t<=16": [], "t<=256": [], "t>256": []}
    for i in range(B):
        cum, t = 0.0, 0
        for k in range(T):
            if not mask[i, k]:
                continue
            t += 1
            cum += (logp[i, k] - old[i, k]).item()
            A, s = adv[i, k].item(), math.sqrt(t)
            counts["n"] += 1
            counts["low"] += cum < -0.025 * s and A < 0
            counts["high"] += cum > 0.05 * s and A > 0
            pre_dual = max(-A * math.exp(cum), -A * math.exp(min(max(cum, -0.025 * s), 0.05 * s)))
            counts["dual"] += A < 0 and pre_dual > -A * math.exp(0.05 * s)
            buckets["t<=16" if t <= 16 else "t<=256" if t <= 256 else "t>256"].append(abs(cum))
    n = counts["n"]
    assert reduce_metrics(out.metrics, mask)["clip_ratio/low"].item() == pytest.approx(counts["low"] / n, abs=1e-7)
    assert reduce_metrics(out.metrics, mask)["clip_ratio/high"].item() == pytest.approx(counts["high"] / n, abs=1e-7)
    assert reduce_metrics(out.metrics, mask)["clip_ratio/region"].item() == pytest.approx(
        (counts["low"] + counts["high"]) / n, abs=1e-7
    )
    assert out.metrics["ctpo/dual_clip"].item() == pytest.approx(counts["dual"] / n, abs=1e-7)
    assert counts["low"] and counts["high"] and counts["dual"]
    for label, values in buckets.items():
        key = f"ctpo/abs_cum_log_ratio/{label}"
        assert out.metrics[key].item() == pytest.approx(sum(values) / len(values), rel=1e-6)
    for v in reduce_metrics(out.metrics, mask).values():
        assert v.dim() == 0 and v.dtype == torch.float32 and not v.requires_grad
    short = ctpo_loss(logp[:, :20], old[:, :20], adv[:, :20], mask[:, :20], **DEFAULTS)
    assert torch.isnan(short.metrics["ctpo/abs_cum_log_ratio/t>256"])  # empty bucket


def test_empty_mask_and_rows():
    logp, old, adv, mask = make_inputs(7)
    mask[1] = 0
    logp[1, 3] = float("-inf")  # garbage on padding must not leak
    out, loss, grad = run_ctpo(logp, old, adv, mask, **DEFAULTS)
    assert (out.per_token_loss[1] == 0).all() and (grad[1] == 0).all() and torch.isfinite(grad).all()
    empty = torch.zeros_like(mask)
    out, loss, grad = run_ctpo(logp, old, adv, empty, **DEFAULTS)
    assert loss.item() == 0.0 and (grad == 0).all() and torch.isfinite(out.per_token_loss).all()
    assert all(torch.isnan(v) for v in reduce_metrics(out.metrics, empty).values())


def test_input_validation():
    """The loss checks its tensors; the hyper-parameters' rules are `CTPOConfig`'s, checked once
    (tests/trainers/test_validation.py)."""
    logp, old, adv, mask = make_inputs(8)
    with pytest.raises(ValueError, match="mask"):
        ctpo_loss(logp, old, adv, mask[:, 1:], **DEFAULTS)
    with pytest.raises(ValueError, match="advantages"):
        ctpo_loss(logp, old, adv[:2], mask, **DEFAULTS)


# ----------------------------------------------------------------------------------------------
# Unbiasedness and variance on tabular autoregressive problems (vocab 3; all V**L sequences)
# ----------------------------------------------------------------------------------------------
V = 3


class Tabular:
    """Softmax policy with one logits row per prefix; behaviour mu = pi with perturbed logits.

    Sequences are enumerated in lexicographic order, so (V**L,) tensors reshape to (V,)*L.
    """

    def __init__(self, length: int, perturbation: float, seed: int = 0):
        self.L = length
        self.seqs = list(itertools.product(range(V), repeat=length))
        self.rows = torch.tensor([[self.node(y[:t]) for t in range(length)] for y in self.seqs])  # (S, L)
        self.tokens = torch.tensor(self.seqs)  # (S, L)
        g = torch.Generator().manual_seed(seed)
        num_rows = sum(V**k for k in range(length))
        self.theta = torch.randn(num_rows, V, generator=g, dtype=F64)
        mu_logits = self.theta + perturbation * torch.randn(num_rows, V, generator=g, dtype=F64)
        self.reward = torch.rand(len(self.seqs), generator=g, dtype=F64)  # R(y)
        self.mu_logp = self.token_logps(mu_logits)  # (S, L) behaviour log-probs
        self.mu_seq = self.mu_logp.sum(-1).exp()  # (S,)
        pi_seq = self.token_logps(self.theta).sum(-1).exp()  # (S,)
        # Q^pi(y_<=t) = E_pi[R | y_<=t], the token-level advantage (state-action value)
        joint = pi_seq.reshape((V,) * length)
        weighted = (pi_seq * self.reward).reshape((V,) * length)
        self.q = torch.zeros(len(self.seqs), length, dtype=F64)
        for t in range(length):
            tail = tuple(range(t + 1, length))
            q_t = weighted.sum(tail) / joint.sum(tail) if tail else weighted / joint  # (V,)*(t+1)
            self.q[:, t] = q_t.reshape(-1).repeat_interleave(V ** (length - t - 1))

    @staticmethod
    def node(prefix) -> int:
        """Index of a prefix among all prefixes of length 0, 1, 2, ... (breadth-first)."""
        offset = sum(V**k for k in range(len(prefix)))
        return offset + sum(tok * V ** (len(prefix) - 1 - j) for j, tok in enumerate(prefix))

    def token_logps(self, logits):
        """(S, L) log pi(y_t | y_<t) for all sequences, differentiable in the logits table."""
        return torch.log_softmax(logits[self.rows], -1).gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)

    def ctpo_objective(self, theta, adv):
        """(S,) sum_t rho_t(prefix) A_t per sequence: minus the unclipped CTPO loss, graph to theta."""
        out = ctpo_loss(
            self.token_logps(theta), self.mu_logp, adv, torch.ones_like(self.mu_logp), **WIDE, position_power=0.5
        )
        return -out.per_token_loss.sum(-1)

    def grad(self, fn):
        theta = self.theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(theta), theta)
        return g

    def per_sample_grads(self, per_sequence):
        """(S, P) gradient of each sequence's term w.r.t. the flattened logits table."""
        theta = self.theta.clone().requires_grad_(True)
        values = per_sequence(theta)
        rows = [torch.autograd.grad(values[n], theta, retain_graph=True)[0].flatten() for n in range(len(values))]
        return torch.stack(rows)

    def full_ratio_objective(self, theta, adv):
        """(S,) prod_t r_t (full-sequence ratio, detached) * sum_t log pi_t A_t."""
        logp = self.token_logps(theta)
        weight = (logp.sum(-1) - self.mu_logp.sum(-1)).exp().detach()
        return weight * (logp * adv).sum(-1)

    def on_policy_objective(self, theta, adv):
        """sum_y pi(y) sum_t log pi_t A_t with pi(y) detached: its gradient is the on-policy one."""
        logp = self.token_logps(theta)
        return (logp.sum(-1).exp().detach() * (logp * adv).sum(-1)).sum()

    def true_objective(self, theta):
        return (self.token_logps(theta).sum(-1).exp() * self.reward).sum()  # E_pi[R]


@pytest.fixture(scope="module")
def small():
    return Tabular(length=3, perturbation=0.35)  # mu close to pi: KL(pi || mu) ~ 0.09


@pytest.fixture(scope="module")
def longer():
    return Tabular(length=5, perturbation=0.5)  # 243 sequences, KL(pi || mu) ~ 0.2


def test_cumulative_ratio_is_unbiased_for_token_level_advantages(small):
    """E_mu[sum_t rho_t grad log pi_t A_t] = sum_y pi(y) sum_t grad log pi_t A_t exactly, for A_t a
    function of the prefix y_<=t (the token-level formulation); with A_t = Q^pi it is grad E_pi[R]."""
    p = small
    assert p.mu_seq.sum().item() == pytest.approx(1.0, abs=1e-12)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(sum(V**k for k in range(p.L + 1)), generator=g, dtype=F64)
    arbitrary = torch.tensor([[table[p.node(y[: t + 1])] for t in range(p.L)] for y in p.seqs], dtype=F64)
    for adv in (arbitrary, p.q):
        off_policy = p.grad(lambda th, adv=adv: (p.mu_seq * p.ctpo_objective(th, adv)).sum())
        on_policy = p.grad(lambda th, adv=adv: p.on_policy_objective(th, adv))
        torch.testing.assert_close(off_policy, on_policy, rtol=1e-10, atol=1e-10)
        assert on_policy.abs().max() > 1e-3
    torch.testing.assert_close(on_policy, p.grad(p.true_objective), rtol=1e-10, atol=1e-10)  # last adv: Q^pi


def test_sequence_level_advantage_needs_the_full_ratio(small):
    """With one advantage per sequence (it depends on tokens after t, which come from mu), the
    prefix correction alone is biased off-policy; the full-sequence ratio is unbiased there."""
    p = small
    true_grad = p.grad(p.true_objective)
    full = p.grad(lambda th: (p.mu_seq * p.full_ratio_objective(th, p.reward.unsqueeze(1))).sum())
    torch.testing.assert_close(full, true_grad, rtol=1e-10, atol=1e-10)
    cum = p.grad(lambda th: (p.mu_seq * p.ctpo_objective(th, p.reward)).sum())
    assert (cum - true_grad).abs().max() > 1e-3


def test_cumulative_ratio_has_lower_variance_than_full_ratio(longer):
    """Both estimators are unbiased for A_t = Q^pi(y_<=t); per-sample gradients under mu.

    Exact variances (trace of the covariance under mu, all 243 sequences): the full-sequence
    ratio's is >= 1.2x the cumulative one's (1.25x here). Monte Carlo (fixed seed, 20000 samples
    from mu, the same samples for both estimators): the full ratio's sample variance must exceed
    the cumulative one's by at least half the exact excess, and both sample means must lie within
    5 standard errors of the exact gradient in every coordinate.
    """
    p = longer
    cum = p.per_sample_grads(lambda th: p.ctpo_objective(th, p.q))  # (S, P)
    full = p.per_sample_grads(lambda th: p.full_ratio_objective(th, p.q))  # (S, P)
    mean = p.mu_seq @ cum
    torch.testing.assert_close(p.mu_seq @ full, mean, rtol=1e-10, atol=1e-10)  # same expectation
    torch.testing.assert_close(mean.view_as(p.theta), p.grad(p.true_objective), rtol=1e-10, atol=1e-10)

    var_cum = (p.mu_seq * ((cum - mean) ** 2).sum(-1)).sum().item()
    var_full = (p.mu_seq * ((full - mean) ** 2).sum(-1)).sum().item()
    assert var_full > 1.2 * var_cum, (var_full, var_cum)

    g = torch.Generator().manual_seed(2)
    idx = torch.multinomial(p.mu_seq, 20000, replacement=True, generator=g)
    mc_var_cum, mc_var_full = cum[idx].var(0).sum().item(), full[idx].var(0).sum().item()
    assert mc_var_full > mc_var_cum * (1 + 0.5 * (var_full / var_cum - 1)), (mc_var_full, mc_var_cum)
    for exact, samples in ((cum, cum[idx]), (full, full[idx])):
        se = ((p.mu_seq @ (exact - mean) ** 2) / len(idx)).sqrt()  # exact standard error per coordinate
        error = (samples.mean(0) - mean).abs()
        assert (error <= 5 * se + 1e-12).all()
