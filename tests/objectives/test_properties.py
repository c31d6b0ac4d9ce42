"""Property-based tests (hypothesis) for every objective and advantage function in ``trl_groupopt/methods/*/objective.py``.

Inputs are built from drawn seeds and shapes (``torch.Generator``): B in 1..12 and T in 1..40
(a separate strategy makes one 64-member group, B = 64), masks with empty rows and holes,
log-ratios in [-50, 50] (zero, small, wide, exactly +-50, mixed per token), advantages that are
zero, tiny, standard normal, exactly +-1e4 or mixed, groups of size 1, 2, 3, 4 and a 64-group, in the
trainer's layout (consecutive runs of one size) under arbitrary (negative, large) integer ids; float32,
bfloat16 and float64. Properties:

(a) loss and the gradient w.r.t. ``per_token_logps`` (autograd on a leaf of the input dtype) are
    finite; the loss is exactly 0 where mask = 0 for the objectives that document it (ECHO, CTPO),
    and for the others contributes 0 after masking (value and gradient of ``sum(loss * mask)``);
    no gradient reaches masked positions; outputs have the compute dtype (float32 for bf16 input);
(b) permutation equivariance: permuting sequences (and, for group methods, whole groups AND rows
    within groups, which keeps the layout, with ``group_ids`` permuted along and relabelled) permutes per-sequence losses,
    gradients and advantages accordingly, and leaves the batch metrics unchanged;
(c) metrics are detached, 0-dim float32 (except TRL's per-token indicators of
    ``clipped_surrogate_loss``), finite or NaN but never inf; clip fractions lie in [0, 1] with
    ``max(low, high) <= region <= low + high``; they are NaN exactly when there is no valid token;
(d) ``group_transform``: "none" is the identity, "min_replace" <= s_bar and is the group minimum,
    "orth_proj" gives ``sum_i A_i s_til_i = 0`` per group (relative to ``sum_i |A_i| max(s_bar,
    s_til)_i``) and ``s_til >= floor`` in mixed-sign and all-zero groups, "orth_proj_qp" gives
    ``s_til >= 0`` and the same orthogonality; ``otb_advantages`` are 0 where mask = 0 and on rows
    with a NaN reward, and equal the reward on the valid tokens of a group with one scored member.

Tolerances for (b): rtol 1e-9 (float64) / 1e-4 (float32) with an absolute floor of rtol times the
largest magnitude in the tensor (batch-coupled sums are re-ordered by the permutation).
Every test uses ``derandomize=True``: CI draws the same examples on every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.objectives.dfpo_logged import dfpo_logged as dfpo_loss
from tests.objectives.groups import groups_of
from tests.objectives.metrics import reduce_metrics
from trl_groupopt.core.common import clipped_surrogate_loss, energy_from_log_probs
from trl_groupopt.methods.ctpo.objective import ctpo_loss
from trl_groupopt.methods.dfpo.grpo_fix import symmetric_clip_loss
from trl_groupopt.methods.dfpo.objective import group_transform
from trl_groupopt.methods.echo.objective import echo_batch_ratio_coupling, echo_loss
from trl_groupopt.methods.otb.objective import logit_gradient_energy, otb_advantages

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
ALL_DTYPES = (F32, BF16, F64)
PERM_DTYPES = (F32, F64)  # bf16 inputs are upcast before any arithmetic: float32 covers them
RTOL = {F32: 1e-4, F64: 1e-9}
FLOOR = 1e-6  # dfpo's default orth_floor


def hsettings(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------------------------
# input builders (everything from one torch.Generator seeded by hypothesis)
# ---------------------------------------------------------------------------------------------

MASK_KINDS = ("full", "right_pad", "holes", "mixed_rows", "all_empty")
RATIO_KINDS = ("zero", "small", "wide", "extreme", "mixed")
ADV_KINDS = ("zero", "tiny", "normal", "huge", "mixed")
MASK_DTYPES = (torch.int64, torch.bool, torch.float32)


def make_mask(gen: torch.Generator, batch: int, length: int, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 0/1 mask; every kind but "full" can produce empty rows."""
    if kind == "full":
        mask = torch.ones(batch, length)
    elif kind == "all_empty":
        mask = torch.zeros(batch, length)
    elif kind == "right_pad":  # TRL completion mask, lengths 0..T
        lengths = torch.randint(0, length + 1, (batch,), generator=gen)
        mask = (torch.arange(length) < lengths.unsqueeze(1)).float()
    elif kind == "holes":  # tool-mask style holes
        mask = (torch.rand(batch, length, generator=gen) < 0.6).float()
    else:  # each row one of: full, prefix, holes, empty; at least one empty row when B > 1
        rows = []
        for b in range(batch):
            choice = int(torch.randint(0, 4, (1,), generator=gen)) if b else 3
            if choice == 0:
                rows.append(torch.ones(length))
            elif choice == 1:
                n = int(torch.randint(0, length + 1, (1,), generator=gen))
                rows.append((torch.arange(length) < n).float())
            elif choice == 2:
                rows.append((torch.rand(length, generator=gen) < 0.5).float())
            else:
                rows.append(torch.zeros(length))
        mask = torch.stack(rows)
        mask = mask[torch.randperm(batch, generator=gen)]
    return mask.to(dtype)


def make_log_ratio(gen: torch.Generator, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    """float64 log-ratios in [-50, 50]."""
    if kind == "zero":
        out = torch.zeros(shape, dtype=F64)
    elif kind == "small":
        out = 0.1 * torch.randn(shape, generator=gen, dtype=F64)
    elif kind == "wide":
        out = 100.0 * torch.rand(shape, generator=gen, dtype=F64) - 50.0
    elif kind == "extreme":
        out = 50.0 * torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(F64)
    else:
        options = torch.stack(
            [
                torch.zeros(shape, dtype=F64),
                0.1 * torch.randn(shape, generator=gen, dtype=F64),
                100.0 * torch.rand(shape, generator=gen, dtype=F64) - 50.0,
                50.0 * torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(F64),
            ]
        )  # (4, ...)
        pick = torch.randint(0, 4, shape, generator=gen)
        out = options.gather(0, pick.unsqueeze(0)).squeeze(0)
    return out.clamp(-50.0, 50.0)


def make_values(gen: torch.Generator, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    """float64 advantages: zero, tiny, normal, exactly +-1e4, or mixed per element."""
    sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(F64)
    if kind == "zero":
        return torch.zeros(shape, dtype=F64)
    if kind == "tiny":
        return 1e-6 * torch.randn(shape, generator=gen, dtype=F64)
    if kind == "normal":
        return torch.randn(shape, generator=gen, dtype=F64)
    if kind == "huge":
        return 1e4 * sign
    options = torch.stack(
        [
            torch.zeros(shape, dtype=F64),
            torch.randn(shape, generator=gen, dtype=F64),
            1e4 * sign,
            1e4 * (2 * torch.rand(shape, generator=gen, dtype=F64) - 1),
        ]
    )
    pick = torch.randint(0, 4, shape, generator=gen)
    return options.gather(0, pick.unsqueeze(0)).squeeze(0)


@dataclass
class TokenCase:
    """Inputs of a token-level objective, float64 masters (cast to `dtype` when used)."""

    logp: torch.Tensor  # (B, T) float64
    old: torch.Tensor  # (B, T) float64
    adv: torch.Tensor  # (B,) or (B, T) float64
    mask: torch.Tensor  # (B, T) mask dtype
    dtype: torch.dtype
    seed: int

    def leaf(self, perm: torch.Tensor | None = None) -> torch.Tensor:
        x = self.logp if perm is None else self.logp[perm]
        return x.to(self.dtype).detach().clone().requires_grad_(True)

    def inputs(self, perm: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        p = slice(None) if perm is None else perm
        return self.old[p].to(self.dtype), self.adv[p].to(self.dtype), self.mask[p]


@st.composite
def token_cases(draw, dtypes=ALL_DTYPES, adv_shapes=("B", "BT")) -> TokenCase:
    batch = draw(st.integers(1, 12))
    length = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(dtypes))
    mask_kind = draw(st.sampled_from(MASK_KINDS))
    ratio_kind = draw(st.sampled_from(RATIO_KINDS))
    adv_kind = draw(st.sampled_from(ADV_KINDS))
    adv_shape = draw(st.sampled_from(adv_shapes))
    mask_dtype = draw(st.sampled_from(MASK_DTYPES))
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(gen, batch, length, mask_kind, mask_dtype)
    log_ratio = make_log_ratio(gen, (batch, length), ratio_kind)
    old = -5.0 * torch.rand(batch, length, generator=gen, dtype=F64)  # (B, T) log pi_old
    if dtype == BF16:  # exact old in bf16 so that the bf16 log-ratio stays near the drawn one
        old = old.to(BF16).to(F64)
    adv = make_values(gen, (batch,) if adv_shape == "B" else (batch, length), adv_kind)
    return TokenCase(old + log_ratio, old, adv, mask, dtype, seed)


def _relabel(gen: torch.Generator, dense: torch.Tensor) -> torch.Tensor:
    """Map dense group indices 0..K-1 to distinct arbitrary int64 ids (negative, large, unordered)."""
    k = int(dense.max()) + 1
    pool = torch.randperm(4001, generator=gen)[:k] - 2000  # distinct ints in [-2000, 2000]
    pool = pool * 1_000_003  # large, still distinct
    return pool[dense]


@dataclass
class GroupLayout:
    group_ids: torch.Tensor  # (B,) int64, arbitrary ids, consecutive groups of one size
    batch: int


@st.composite
def group_layouts(draw, big: bool = False) -> tuple[GroupLayout, int]:
    """Group structures: consecutive groups of size 1, 2, 3 or 4 (B <= 12), or one 64-group."""
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    if big:
        dense = torch.zeros(64, dtype=torch.int64)
    else:
        size = draw(st.integers(1, 4))
        dense = torch.arange(draw(st.integers(1, 12 // size))).repeat_interleave(size)
    ids = _relabel(gen, dense)
    return GroupLayout(ids, ids.numel()), seed


def make_group_advantages(gen: torch.Generator, dense: torch.Tensor, kind: str) -> torch.Tensor:
    """(B,) float64 sequence advantages in several regimes, per group."""
    batch = dense.numel()
    if kind == "centred":  # TRL: reward - group mean
        r = torch.randn(batch, generator=gen, dtype=F64)
    elif kind == "binary":  # 0/1 rewards, centred: often an all-zero group
        r = (torch.rand(batch, generator=gen) < 0.5).to(F64)
    elif kind == "huge":
        r = 1e4 * torch.where(torch.rand(batch, generator=gen) < 0.5, -1.0, 1.0).to(F64)
    elif kind == "single_sign":  # not group-centred: every non-zero advantage has one sign
        sign = -1.0 if bool(torch.rand(1, generator=gen) < 0.5) else 1.0
        return sign * make_values(gen, (batch,), "mixed").abs()
    else:  # "zero", "tiny", "mixed": raw values, not centred
        return make_values(gen, (batch,), kind)
    k = int(dense.max()) + 1
    mean = torch.zeros(k, dtype=F64).index_add_(0, dense, r) / torch.bincount(dense, minlength=k).to(F64)
    return r - mean[dense]


GROUP_ADV_KINDS = ("centred", "binary", "huge", "zero", "tiny", "mixed", "single_sign")


def dense_of(group_ids: torch.Tensor) -> torch.Tensor:
    return torch.unique(group_ids, return_inverse=True)[1]


def group_permutation(gen: torch.Generator, group_ids: torch.Tensor) -> torch.Tensor:
    """A permutation that moves whole groups to new places AND shuffles rows within each group.

    The result is group-contiguous in a random group order, so rows move both across and within groups.
    """
    dense = dense_of(group_ids)
    k = int(dense.max()) + 1
    perm = []
    for g in torch.randperm(k, generator=gen).tolist():
        rows = torch.nonzero(dense == g).flatten()
        perm.append(rows[torch.randperm(rows.numel(), generator=gen)])
    return torch.cat(perm)


# ---------------------------------------------------------------------------------------------
# assertions
# ---------------------------------------------------------------------------------------------

FRACTION_KEYS = ("echo/batch_clipped", "ctpo/dual_clip", "dfpo/sym_clip_ratio")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str, atol: float = 0.0) -> None:
    """Elementwise |a - e| <= rtol |e| + rtol max|e| + atol (NaN matches NaN, inf never allowed)."""
    a, e = actual.detach().double(), expected.detach().double()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert not torch.isinf(a).any() and not torch.isinf(e).any(), f"{what}: inf"
    both_nan = torch.isnan(a) & torch.isnan(e)
    finite = e[torch.isfinite(e)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    ok = both_nan | ((a - e).abs() <= rtol * e.abs() + rtol * scale + atol)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[0].tolist()
        raise AssertionError(f"{what}: mismatch at {bad}: {a[tuple(bad)].item()} vs {e[tuple(bad)].item()}")


def assert_metrics_permuted(metrics_p: dict, metrics: dict, perm: torch.Tensor, rtol: float) -> None:
    """Per-row metrics (clip indicators, (B, T) or (B, 1)) move with the rows; batch scalars are invariant."""
    assert metrics_p.keys() == metrics.keys()
    for name, value in metrics.items():
        assert_close(metrics_p[name], value[perm] if value.dim() == 2 else value, rtol, name)


def check_metrics(metrics: dict[str, torch.Tensor], n_valid: int | None, scalar: bool = True) -> None:
    """(c): detached, float32 0-dim, never inf; fractions in [0, 1]; NaN iff no valid item."""
    for name, value in metrics.items():
        assert isinstance(value, torch.Tensor), name
        assert not value.requires_grad, f"{name} is not detached"
        if scalar:
            assert value.dim() == 0, f"{name} has shape {tuple(value.shape)}"
            assert value.dtype == F32, f"{name} has dtype {value.dtype}"
        assert not bool(torch.isinf(value).any()), f"metric {name} is inf: {value}"
        if name.startswith("clip_ratio/") or name in FRACTION_KEYS:
            v = value[~torch.isnan(value)]
            assert bool(((v >= 0) & (v <= 1)).all()), f"{name} outside [0, 1]: {value}"
            if scalar and n_valid is not None:
                assert bool(torch.isnan(value)) == (n_valid == 0), f"{name}={value.item()} with {n_valid} valid"
    if all(k in metrics for k in ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region")):
        low, high, region = (metrics[f"clip_ratio/{k}"] for k in ("low", "high", "region"))
        keep = ~torch.isnan(region)
        assert bool((region[keep] >= torch.maximum(low, high)[keep]).all()), "region < max(low, high)"
        assert bool((region[keep] <= (low + high)[keep] + 1e-6).all()), "region > low + high"


def check_loss_and_grad(
    loss: torch.Tensor,
    leaf: torch.Tensor,
    mask: torch.Tensor,
    *,
    zero_at_mask: bool,
    out_dtype: torch.dtype | None,
) -> torch.Tensor:
    """(a): finite loss, finite gradient, nothing from masked positions. Returns the gradient."""
    valid = mask.bool()  # (B, T)
    if out_dtype is not None:
        assert loss.dtype == out_dtype, f"loss dtype {loss.dtype}, expected {out_dtype}"
    assert bool(torch.isfinite(loss).all()), f"non-finite loss: {loss}"
    masked = loss * valid.to(loss.dtype)  # (B, T) what the trainer aggregates
    assert bool((masked[~valid.expand_as(masked)] == 0).all())
    if zero_at_mask:
        assert loss.shape == mask.shape
        assert bool((loss[~valid] == 0).all()), "loss is not exactly 0 where mask = 0"
        total = loss.sum()
    else:
        total = masked.sum()
    assert bool(torch.isfinite(total)), f"aggregated loss overflows: {total}"
    (grad,) = torch.autograd.grad(total, leaf, allow_unused=True)
    if grad is None:  # e.g. every row clipped or empty: the gradient is identically 0
        grad = torch.zeros_like(leaf)
    assert grad.dtype == leaf.dtype
    assert bool(torch.isfinite(grad).all()), f"non-finite gradient: {grad}"
    assert bool((grad[~valid] == 0).all()), "gradient reaches masked positions"
    return grad


def compute_dtype_of(dtype: torch.dtype) -> torch.dtype:
    return F64 if dtype == F64 else F32


# ---------------------------------------------------------------------------------------------
# clipped_surrogate_loss (TRL's GRPO / GSPO, the default objective)
# ---------------------------------------------------------------------------------------------

surrogate_options = st.fixed_dictionaries(
    {
        "epsilon_low": st.sampled_from([0.2, 0.025, 0.9]),
        "epsilon_high": st.sampled_from([0.2, 0.28, 0.001]),
        "importance_sampling_level": st.sampled_from(["token", "sequence"]),
        "delta": st.sampled_from([None, 4.0]),
    }
)


@hsettings(60)
@given(case=token_cases(), opts=surrogate_options)
def test_clipped_surrogate_finite_masked_and_metrics(case, opts):
    leaf = case.leaf()
    old, adv, mask = case.inputs()
    out = clipped_surrogate_loss(leaf, old, adv, mask, **opts)
    # TRL parity: computed in the input dtype, per-token indicators as TRL logs them
    check_loss_and_grad(out.per_token_loss, leaf, mask, zero_at_mask=False, out_dtype=None)
    check_metrics(out.metrics, None, scalar=False)


@hsettings(40)
@given(case=token_cases(dtypes=PERM_DTYPES), opts=surrogate_options, perm_seed=st.integers(0, 2**31 - 1))
def test_clipped_surrogate_permutation_equivariant(case, opts, perm_seed):
    perm = torch.randperm(case.logp.shape[0], generator=torch.Generator().manual_seed(perm_seed))
    leaf, leaf_p = case.leaf(), case.leaf(perm)
    out = clipped_surrogate_loss(leaf, *case.inputs(), **opts)
    out_p = clipped_surrogate_loss(leaf_p, *case.inputs(perm), **opts)
    mask = case.mask.to(out.per_token_loss.dtype)
    (grad,) = torch.autograd.grad((out.per_token_loss * mask).sum(), leaf)
    (grad_p,) = torch.autograd.grad((out_p.per_token_loss * mask[perm]).sum(), leaf_p)
    rtol = RTOL[case.dtype]
    assert_close(out_p.per_token_loss, out.per_token_loss[perm], rtol, "loss")
    assert_close(grad_p, grad[perm], rtol, "grad")


# ---------------------------------------------------------------------------------------------
# ECHO
# ---------------------------------------------------------------------------------------------

echo_options = st.fixed_dictionaries(
    {
        "epsilon_low": st.sampled_from([0.2, 0.025]),
        "epsilon_high": st.sampled_from([0.2, 0.28]),
        "batch_epsilon_low": st.sampled_from([0.05, 0.2, 1.0, 5.0]),  # >= 1: no lower bound
        "batch_epsilon_high": st.sampled_from([0.05, 0.2, 10.0]),
        "token_clip": st.booleans(),
    }
)


@hsettings(60)
@given(case=token_cases(), opts=echo_options)
def test_echo_finite_masked_and_metrics(case, opts):
    leaf = case.leaf()
    old, adv, mask = case.inputs()
    out = echo_loss(leaf, old, adv, mask, **opts)
    check_loss_and_grad(out.per_token_loss, leaf, mask, zero_at_mask=True, out_dtype=compute_dtype_of(case.dtype))
    n_valid = int(mask.bool().sum())
    check_metrics(reduce_metrics(out.metrics, mask), n_valid)
    if n_valid:
        assert bool(torch.isfinite(out.metrics["echo/batch_ratio"])) and out.metrics["echo/batch_ratio"] > 0
    coupling = echo_batch_ratio_coupling(leaf.detach(), old, adv, mask, **opts)
    assert coupling.dim() == 0 and bool(torch.isfinite(coupling)) and not coupling.requires_grad
    if n_valid and out.metrics["echo/batch_clipped"] == 1:  # documented: no coupling when R is clipped
        assert coupling == 0


@hsettings(40)
@given(case=token_cases(dtypes=PERM_DTYPES), opts=echo_options, perm_seed=st.integers(0, 2**31 - 1))
def test_echo_permutation_equivariant(case, opts, perm_seed):
    """Any row permutation: R (a sum over all tokens) is invariant, so rows just move."""
    perm = torch.randperm(case.logp.shape[0], generator=torch.Generator().manual_seed(perm_seed))
    leaf, leaf_p = case.leaf(), case.leaf(perm)
    out = echo_loss(leaf, *case.inputs(), **opts)
    out_p = echo_loss(leaf_p, *case.inputs(perm), **opts)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), leaf)
    (grad_p,) = torch.autograd.grad(out_p.per_token_loss.sum(), leaf_p)
    rtol = RTOL[case.dtype]
    assert_close(out_p.per_token_loss, out.per_token_loss[perm], rtol, "loss")
    assert_close(grad_p, grad[perm], rtol, "grad")
    assert_metrics_permuted(out_p.metrics, out.metrics, perm, rtol)
    coupling = echo_batch_ratio_coupling(leaf.detach(), *case.inputs(), **opts)
    coupling_p = echo_batch_ratio_coupling(leaf_p.detach(), *case.inputs(perm), **opts)
    assert_close(coupling_p, coupling, rtol, "coupling")


@hsettings(30)
@given(case=token_cases(dtypes=(F64,)), opts=echo_options)
def test_echo_global_scope_with_local_totals_is_micro_batch(case, opts):
    """Global scope whose totals are this batch's own (one process) equals the micro-batch scope."""
    old, adv, mask = case.inputs()
    valid = mask.bool()
    log_ratio_sum = sum(
        float(case.logp[i, t] - case.old[i, t])
        for i in range(valid.shape[0])
        for t in range(valid.shape[1])
        if valid[i, t]
    )
    token_count = int(valid.sum())
    leaf, leaf_g = case.leaf(), case.leaf()
    out = echo_loss(leaf, old, adv, mask, **opts)
    kwargs = dict(opts, log_ratio_sum=torch.tensor(log_ratio_sum, dtype=F64), token_count=torch.tensor(token_count))
    coupling = echo_batch_ratio_coupling(leaf_g.detach(), old, adv, mask, **kwargs)
    out_g = echo_loss(leaf_g, old, adv, mask, coupling_sum=coupling, **kwargs)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), leaf)
    (grad_g,) = torch.autograd.grad(out_g.per_token_loss.sum(), leaf_g)
    assert_close(out_g.per_token_loss, out.per_token_loss, 1e-9, "loss")
    assert_close(grad_g, grad, 1e-9, "grad")


# ---------------------------------------------------------------------------------------------
# CTPO
# ---------------------------------------------------------------------------------------------

ctpo_options = st.fixed_dictionaries(
    {
        "epsilon_low": st.sampled_from([0.025, 0.2]),
        "epsilon_high": st.sampled_from([0.05, 0.28]),
        "dual_clip": st.sampled_from([0.05, 3.0]),  # 3.0 with p = 1 reaches the dual-clip cap
        "position_power": st.sampled_from([0.0, 0.5, 1.0]),
    }
)


@hsettings(60)
@given(case=token_cases(), opts=ctpo_options)
def test_ctpo_finite_masked_and_metrics(case, opts):
    leaf = case.leaf()
    old, adv, mask = case.inputs()
    out = ctpo_loss(leaf, old, adv, mask, **opts)
    check_loss_and_grad(out.per_token_loss, leaf, mask, zero_at_mask=True, out_dtype=compute_dtype_of(case.dtype))
    n_valid = int(mask.bool().sum())
    reduced = reduce_metrics(out.metrics, mask)
    check_metrics({k: v for k, v in reduced.items() if "abs_cum" not in k}, n_valid)
    check_metrics({k: v for k, v in reduced.items() if "abs_cum" in k}, None)


@hsettings(40)
@given(case=token_cases(dtypes=PERM_DTYPES), opts=ctpo_options, perm_seed=st.integers(0, 2**31 - 1))
def test_ctpo_permutation_equivariant(case, opts, perm_seed):
    perm = torch.randperm(case.logp.shape[0], generator=torch.Generator().manual_seed(perm_seed))
    leaf, leaf_p = case.leaf(), case.leaf(perm)
    out = ctpo_loss(leaf, *case.inputs(), **opts)
    out_p = ctpo_loss(leaf_p, *case.inputs(perm), **opts)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), leaf)
    (grad_p,) = torch.autograd.grad(out_p.per_token_loss.sum(), leaf_p)
    rtol = RTOL[case.dtype]
    assert_close(out_p.per_token_loss, out.per_token_loss[perm], rtol, "loss")
    assert_close(grad_p, grad[perm], rtol, "grad")
    assert_metrics_permuted(out_p.metrics, out.metrics, perm, rtol)


# ---------------------------------------------------------------------------------------------
# DFPO: symmetric clip (GRPO-fix), group_transform, dfpo_loss
# ---------------------------------------------------------------------------------------------


@hsettings(50)
@given(case=token_cases(adv_shapes=("B", "BT")), eps=st.sampled_from([0.2, 0.28, 0.001]))
def test_symmetric_clip_finite_masked_and_metrics(case, eps):
    leaf = case.leaf()
    old, adv, mask = case.inputs()
    out = symmetric_clip_loss(leaf, old, adv, mask, epsilon_high=eps)
    check_loss_and_grad(out.per_token_loss, leaf, mask, zero_at_mask=False, out_dtype=compute_dtype_of(case.dtype))
    check_metrics(reduce_metrics(out.metrics, mask), int(mask.bool().sum()))


@hsettings(40)
@given(case=token_cases(dtypes=PERM_DTYPES), eps=st.sampled_from([0.2, 0.001]), perm_seed=st.integers(0, 2**31 - 1))
def test_symmetric_clip_permutation_equivariant(case, eps, perm_seed):
    perm = torch.randperm(case.logp.shape[0], generator=torch.Generator().manual_seed(perm_seed))
    leaf, leaf_p = case.leaf(), case.leaf(perm)
    out = symmetric_clip_loss(leaf, *case.inputs(), epsilon_high=eps)
    out_p = symmetric_clip_loss(leaf_p, *case.inputs(perm), epsilon_high=eps)
    mask = case.mask.to(out.per_token_loss.dtype)
    (grad,) = torch.autograd.grad((out.per_token_loss * mask).sum(), leaf)
    (grad_p,) = torch.autograd.grad((out_p.per_token_loss * mask[perm]).sum(), leaf_p)
    rtol = RTOL[case.dtype]
    assert_close(out_p.per_token_loss, out.per_token_loss[perm], rtol, "loss")
    assert_close(grad_p, grad[perm], rtol, "grad")
    assert_metrics_permuted(out_p.metrics, out.metrics, perm, rtol)


S_KINDS = ("near_one", "wide", "ties", "tiny", "mixed")


def make_s_bar(gen: torch.Generator, batch: int, kind: str) -> torch.Tensor:
    """(B,) float64 positive weights: GSPO-like near 1, exp([-50, 50]), ties, below the floor."""
    if kind == "near_one":
        return 1.0 + 0.3 * (2 * torch.rand(batch, generator=gen, dtype=F64) - 1)
    if kind == "wide":
        return torch.exp(100.0 * torch.rand(batch, generator=gen, dtype=F64) - 50.0)
    if kind == "ties":
        return torch.tensor([0.8, 1.0, 1.2], dtype=F64)[torch.randint(0, 3, (batch,), generator=gen)]
    if kind == "tiny":
        return torch.exp(-30.0 * torch.rand(batch, generator=gen, dtype=F64) - 5.0)  # around the floor
    pick = torch.randint(0, 3, (batch,), generator=gen)
    options = torch.stack([make_s_bar(gen, batch, k) for k in ("near_one", "wide", "tiny")])
    return options.gather(0, pick.unsqueeze(0)).squeeze(0)


@st.composite
def transform_cases(draw, big: bool = False):
    layout, seed = draw(group_layouts(big=big))
    gen = torch.Generator().manual_seed(seed + 1)
    dense = dense_of(layout.group_ids)
    s_bar = make_s_bar(gen, layout.batch, draw(st.sampled_from(S_KINDS)))
    adv = make_group_advantages(gen, dense, draw(st.sampled_from(GROUP_ADV_KINDS)))
    dtype = draw(st.sampled_from(ALL_DTYPES))
    return layout.group_ids, s_bar, adv, dtype, seed


def check_transform(s_bar: torch.Tensor, adv: torch.Tensor, group_ids: torch.Tensor, dtype: torch.dtype) -> None:
    """(d) for every method on one input, group by group (plain loops)."""
    cdtype = compute_dtype_of(dtype)
    s_in, a_in = s_bar.to(dtype), adv.to(dtype)
    s, a = s_in.to(cdtype), a_in.to(cdtype)  # what the transform sees after its upcast
    rtol = 1e-4 if cdtype == F32 else 1e-10
    dense = dense_of(group_ids)
    groups = [torch.nonzero(dense == g).flatten() for g in range(int(dense.max()) + 1)]
    for method in ("none", "min_replace", "orth_proj", "orth_proj_qp"):
        out = group_transform(s_in, a_in, groups_of(group_ids), method)
        assert out.shape == s.shape and out.dtype == cdtype and not out.requires_grad, method
        assert bool(torch.isfinite(out).all()), f"{method}: non-finite s_til {out}"
        assert bool((out >= 0).all()), f"{method}: negative s_til {out}"
        if method == "none":
            assert torch.equal(out, s)
        for rows in groups:
            o, sg, ag = out[rows].double(), s[rows].double(), a[rows].double()
            if method == "min_replace":
                assert bool((o <= sg).all()), "min_replace > s_bar"
                if bool((ag > 0).any() and (ag < 0).any()):
                    assert bool((o == sg.min()).all()), "min_replace is not the group minimum"
                else:  # no pair of opposite signs (all-equal rewards): 0 where A != 0, the minimum elsewhere
                    assert bool((o == torch.where(ag != 0, 0.0, sg.min())).all()), "single-sign group not zeroed"
            if method in ("orth_proj", "orth_proj_qp"):
                scale = float((ag.abs() * torch.maximum(sg, o)).sum())
                residual = float((ag * o).sum())
                assert abs(residual) <= rtol * scale + 1e-300, (
                    f"{method}: sum A s_til = {residual} (scale {scale}) A={ag.tolist()} s={sg.tolist()} out={o.tolist()}"
                )
            if method == "orth_proj":
                mixed = bool((ag > 0).any() and (ag < 0).any())
                all_zero = bool((ag == 0).all())
                if mixed or all_zero:
                    assert bool((o >= FLOOR * (1 - 1e-6)).all()), f"orth_proj below floor: {o.tolist()}"
                if all_zero:
                    assert torch.equal(out[rows], s[rows].clamp_min(FLOOR)), "all-zero group changed"


@hsettings(80)
@given(case=transform_cases())
def test_group_transform_properties(case):
    group_ids, s_bar, adv, dtype, _ = case
    check_transform(s_bar, adv, group_ids, dtype)


@hsettings(15)
@given(case=transform_cases(big=True))
def test_group_transform_properties_group_of_64(case):
    group_ids, s_bar, adv, dtype, _ = case
    check_transform(s_bar, adv, group_ids, dtype)


@hsettings(40)
@given(case=transform_cases())
def test_group_transform_permutation_equivariant(case):
    group_ids, s_bar, adv, dtype, seed = case
    dtype = F32 if dtype == BF16 else dtype
    gen = torch.Generator().manual_seed(seed + 2)
    perm = group_permutation(gen, group_ids)
    ids_p = _relabel(gen, dense_of(group_ids))[perm]  # new arbitrary labels, same partition
    for method in ("none", "min_replace", "orth_proj", "orth_proj_qp"):
        out = group_transform(s_bar.to(dtype), adv.to(dtype), groups_of(group_ids), method)
        out_p = group_transform(s_bar[perm].to(dtype), adv[perm].to(dtype), groups_of(ids_p), method)
        assert_close(out_p, out[perm], RTOL[dtype], method)


@dataclass
class GroupCase:
    token: TokenCase  # adv is (B,) sequence advantages
    group_ids: torch.Tensor


@st.composite
def dfpo_cases(draw, big: bool = False, dtypes=ALL_DTYPES):
    layout, seed = draw(group_layouts(big=big))
    batch = layout.batch
    length = draw(st.integers(1, 16 if big else 40))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(seed + 3)
    mask = make_mask(gen, batch, length, draw(st.sampled_from(MASK_KINDS)), draw(st.sampled_from(MASK_DTYPES)))
    log_ratio = make_log_ratio(gen, (batch, length), draw(st.sampled_from(RATIO_KINDS)))
    old = -5.0 * torch.rand(batch, length, generator=gen, dtype=F64)
    if dtype == BF16:
        old = old.to(BF16).to(F64)
    adv = make_group_advantages(gen, dense_of(layout.group_ids), draw(st.sampled_from(GROUP_ADV_KINDS)))
    if draw(st.booleans()):  # TRL passes (B,) expanded to (B, T), constant along T
        adv = adv.unsqueeze(1).expand(batch, length).contiguous()
    return GroupCase(TokenCase(old + log_ratio, old, adv, mask, dtype, seed), layout.group_ids)


dfpo_options = st.fixed_dictionaries(
    {
        "transform": st.sampled_from(["none", "min_replace", "orth_proj", "orth_proj_qp"]),
        "epsilon_low": st.sampled_from([3e-4, 0.2]),
        "epsilon_high": st.sampled_from([4e-4, 0.28]),
    }
)


def _dfpo_finite(case: GroupCase, opts: dict) -> None:
    tc = case.token
    leaf = tc.leaf()
    old, adv, mask = tc.inputs()
    out = dfpo_loss(leaf, old, adv, mask, groups_of(case.group_ids), **opts)
    assert out.per_token_loss.shape == (tc.logp.shape[0], 1)
    check_loss_and_grad(out.per_token_loss, leaf, mask, zero_at_mask=False, out_dtype=compute_dtype_of(tc.dtype))
    # the Eq. 23 variances are checked for "never inf" in test_dfpo_asym_metrics_never_inf below
    asym = {k: v for k, v in out.metrics.items() if k.startswith("dfpo/asym")}
    batch, length = tc.logp.shape
    for name in ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region"):  # (B, 1) 0/1 indicators
        value = out.metrics[name]
        assert value.shape == (batch, 1) and value.dtype == F32 and not value.requires_grad, name
        assert bool(((value == 0) | (value == 1)).all()), name
    # common.clip_fraction counts sequences for (B, 1) indicators, but valid tokens when T == 1
    n_valid = batch if length > 1 else int(mask.bool().sum())
    check_metrics({k: v for k, v in reduce_metrics(out.metrics, mask).items() if k not in asym}, n_valid)
    for name, value in asym.items():
        assert value.dim() == 0 and value.dtype == F32 and not value.requires_grad, name
        assert not bool(torch.isnan(value)) and value >= 0, (name, value)  # B >= 1: defined
    for name in ("dfpo/shrink", "dfpo/cancellation_residual"):  # NaN when no group qualifies
        value = out.metrics[name]
        assert bool(torch.isnan(value)) or value >= 0, (name, value)
    residual = out.metrics["dfpo/cancellation_residual"]
    assert bool(torch.isnan(residual)) or residual <= 1 + 1e-6


@hsettings(70)
@given(case=dfpo_cases(), opts=dfpo_options)
def test_dfpo_finite_masked_and_metrics(case, opts):
    _dfpo_finite(case, opts)


@hsettings(12)
@given(case=dfpo_cases(big=True), opts=dfpo_options)
def test_dfpo_finite_masked_and_metrics_group_of_64(case, opts):
    _dfpo_finite(case, opts)


@hsettings(40)
@given(
    case=dfpo_cases(),
    transform=st.sampled_from(["orth_proj", "orth_proj_qp"]),
    weights_kind=st.sampled_from(["none", "sequence", "token"]),
    loss_type=st.sampled_from(["dapo", "grpo"]),
)
def test_dfpo_unclipped_with_is_weights(case, transform, weights_kind, loss_type):
    """orthogonal_over="unclipped" with vLLM IS weights (some exactly 0, as TRL's mask modes): (a) and (c) hold,
    and in float64 with a token-sum loss_type the cancellation residual is 0 up to rounding."""
    tc = case.token
    leaf = tc.leaf()
    old, adv, mask = tc.inputs()
    batch, length = tc.logp.shape
    gen = torch.Generator().manual_seed(tc.seed + 5)
    weights = None
    if weights_kind != "none":
        size = (batch, 1) if weights_kind == "sequence" else (batch, length)
        weights = 3 * torch.rand(size, generator=gen) * (torch.rand(size, generator=gen) < 0.8)
    groups = groups_of(case.group_ids)
    out = dfpo_loss(leaf, old, adv, mask, groups, transform=transform, epsilon_low=0.2, epsilon_high=0.28,
                    orthogonal_over="unclipped", importance_weights=weights, loss_type=loss_type)  # fmt: skip
    check_loss_and_grad(out.per_token_loss, leaf, mask, zero_at_mask=False, out_dtype=compute_dtype_of(tc.dtype))
    residual = out.metrics["dfpo/cancellation_residual"]
    assert bool(torch.isnan(residual)) or 0 <= residual <= 1 + 1e-6
    if tc.dtype == F64 and loss_type == "dapo" and not bool(torch.isnan(residual)):
        assert residual < 1e-6, residual


_ASYM_OVERFLOW = GroupCase(
    TokenCase(
        logp=torch.tensor([[50.0], [0.0]], dtype=F64),
        old=torch.zeros(2, 1, dtype=F64),
        adv=torch.tensor([-1.0, 1.0], dtype=F64),
        mask=torch.ones(2, 1, dtype=torch.int64),
        dtype=F32,
        seed=0,
    ),
    torch.tensor([0, 0]),
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: the minimal example is given explicitly
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@example(case=_ASYM_OVERFLOW, opts={"transform": "none", "epsilon_low": 0.2, "epsilon_high": 0.28})
@given(case=dfpo_cases(), opts=dfpo_options)
def test_dfpo_asym_metrics_never_inf(case, opts):
    tc = case.token
    out = dfpo_loss(tc.leaf(), *tc.inputs(), groups_of(case.group_ids), **opts)
    for name in ("dfpo/asym_before", "dfpo/asym_after"):
        assert not bool(torch.isinf(out.metrics[name])), f"{name} is inf"


@hsettings(50)
@given(
    case=dfpo_cases(dtypes=PERM_DTYPES),
    opts=dfpo_options,
    perm_seed=st.integers(0, 2**31 - 1),
)
def test_dfpo_permutation_equivariant(case, opts, perm_seed):
    tc, ids = case.token, case.group_ids
    gen = torch.Generator().manual_seed(perm_seed)
    perm = group_permutation(gen, ids)
    ids_p = _relabel(gen, dense_of(ids))[perm]
    leaf, leaf_p = tc.leaf(), tc.leaf(perm)
    out = dfpo_loss(leaf, *tc.inputs(), groups_of(ids), **opts)
    out_p = dfpo_loss(leaf_p, *tc.inputs(perm), groups_of(ids_p), **opts)
    mask = tc.mask.to(out.per_token_loss.dtype)
    (grad,) = torch.autograd.grad((out.per_token_loss * mask).sum(), leaf, allow_unused=True)
    (grad_p,) = torch.autograd.grad((out_p.per_token_loss * mask[perm]).sum(), leaf_p, allow_unused=True)
    grad = torch.zeros_like(leaf) if grad is None else grad
    grad_p = torch.zeros_like(leaf_p) if grad_p is None else grad_p
    rtol = RTOL[tc.dtype]
    assert_close(out_p.per_token_loss, out.per_token_loss[perm], rtol, "loss")
    assert_close(grad_p, grad[perm], rtol, "grad")
    for name in ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region"):  # (B, 1) indicators move with rows
        assert_close(out_p.metrics[name], out.metrics[name][perm], rtol, name)
    assert_close(out_p.metrics["dfpo/shrink"], out.metrics["dfpo/shrink"], rtol, "dfpo/shrink")
    residual, residual_p = out.metrics["dfpo/cancellation_residual"], out_p.metrics["dfpo/cancellation_residual"]
    assert_close(residual_p, residual, rtol, "residual", atol=1e-12)  # a ratio in [0, 1]: an exact 0 may round


# ---------------------------------------------------------------------------------------------
# OTB: energies and advantages
# ---------------------------------------------------------------------------------------------


@hsettings(40)
@given(
    batch=st.integers(1, 12),
    length=st.integers(1, 40),
    vocab=st.integers(1, 50),
    scale=st.sampled_from([0.0, 1.0, 30.0, 1e4]),
    temperature=st.sampled_from([0.3, 1.0, 2.0]),
    dtype=st.sampled_from(ALL_DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_logit_gradient_energy_finite_bounded_equivariant(batch, length, vocab, scale, temperature, dtype, seed):
    """e = ||onehot(y) - p||^2 lies in [0, 2]; rows are independent (chunking, permutation)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(batch, length, vocab, generator=gen)).to(dtype)
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    energy = logit_gradient_energy(logits, ids, temperature)
    assert energy.shape == (batch, length) and energy.dtype == compute_dtype_of(dtype)
    assert bool(torch.isfinite(energy).all())
    assert bool(((energy >= 0) & (energy <= 2 + 1e-6)).all()), energy
    rtol = RTOL[compute_dtype_of(dtype)]
    assert_close(logit_gradient_energy(logits, ids, temperature, chunk_size=3), energy, rtol, "chunked")
    perm = torch.randperm(batch, generator=gen)
    assert_close(logit_gradient_energy(logits[perm], ids[perm], temperature), energy[perm], rtol, "perm")
    # the fused-LM-head route on the same distribution agrees, up to the rounding of log p itself:
    # z - logsumexp(z) loses about eps * max|z| absolutely, which moves p (and e) by a few times that
    z = logits.to(compute_dtype_of(dtype)) / temperature
    log_p = torch.log_softmax(z, -1)
    log_p_y = log_p.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    log_sum_sq = torch.logsumexp(2 * log_p, -1)
    via_log_probs = energy_from_log_probs(log_p_y, log_sum_sq)
    tol = 8 * torch.finfo(z.dtype).eps * max(float(z.abs().max()), 1.0)
    assert float((via_log_probs - energy).abs().max()) <= tol, "energy_from_log_probs disagrees"


@hsettings(30)
@given(case=token_cases(adv_shapes=("B",)))
def test_energy_from_log_probs_finite_bounded(case):
    """Arbitrary log p_y <= 0 and log sum p^2 <= 0 (incl. TRL's 0/0 padding): energy in [0, 2]."""
    log_p_y = -(case.logp - case.logp.max()).abs()  # (B, T) <= 0, down to about -100
    log_sum_sq = -(case.old.abs() * 10)  # (B, T) <= 0
    pad = ~case.mask.bool()
    log_p_y, log_sum_sq = log_p_y.masked_fill(pad, 0.0), log_sum_sq.masked_fill(pad, 0.0)
    energy = energy_from_log_probs(log_p_y.to(case.dtype), log_sum_sq.to(case.dtype))
    assert energy.dtype == compute_dtype_of(case.dtype) and not energy.requires_grad
    assert bool(torch.isfinite(energy).all()) and bool(((energy >= 0) & (energy <= 2)).all())
    assert bool((energy[pad] == 0).all()), "TRL's padding (0, 0) must give energy 0"


REWARD_KINDS = ("binary", "normal", "huge", "zero", "nan_rows")


@dataclass
class OtbCase:
    rewards: torch.Tensor  # (B,) float64, NaN = unscorable
    energy: torch.Tensor  # (B, T) float64 >= 0
    mask: torch.Tensor
    group_ids: torch.Tensor
    weights: torch.Tensor | None
    dtype: torch.dtype
    handle_zero_tail: bool
    seed: int

    def call(self, perm: torch.Tensor | None = None, group_ids: torch.Tensor | None = None) -> torch.Tensor:
        p = slice(None) if perm is None else perm
        return otb_advantages(
            self.rewards[p].to(self.dtype),
            self.energy[p].to(self.dtype),
            self.mask[p],
            groups_of(self.group_ids if group_ids is None else group_ids),
            handle_zero_tail=self.handle_zero_tail,
            importance_weights=None if self.weights is None else self.weights[p].to(self.dtype),
        )


@st.composite
def otb_cases(draw, big: bool = False, dtypes=ALL_DTYPES):
    layout, seed = draw(group_layouts(big=big))
    batch = layout.batch
    length = draw(st.integers(1, 16 if big else 40))
    gen = torch.Generator().manual_seed(seed + 4)
    mask = make_mask(gen, batch, length, draw(st.sampled_from(MASK_KINDS)), draw(st.sampled_from(MASK_DTYPES)))
    energy_kind = draw(st.sampled_from(("uniform", "zero", "sparse")))
    energy = 2.0 * torch.rand(batch, length, generator=gen, dtype=F64)
    if energy_kind == "zero":
        energy.zero_()
    elif energy_kind == "sparse":  # deterministic tokens (e = 0) between informative ones
        energy = energy * (torch.rand(batch, length, generator=gen) < 0.3)
    reward_kind = draw(st.sampled_from(REWARD_KINDS))
    if reward_kind == "binary":
        rewards = (torch.rand(batch, generator=gen) < 0.5).to(F64)
    elif reward_kind == "normal":
        rewards = torch.randn(batch, generator=gen, dtype=F64)
    elif reward_kind == "huge":
        rewards = 1e4 * (2 * torch.rand(batch, generator=gen, dtype=F64) - 1)
    elif reward_kind == "zero":
        rewards = torch.zeros(batch, dtype=F64)
    else:
        rewards = torch.randn(batch, generator=gen, dtype=F64)
        rewards[torch.rand(batch, generator=gen) < 0.4] = float("nan")
    weights = None
    if draw(st.booleans()):
        weights = torch.exp(4 * torch.rand(batch, length, generator=gen, dtype=F64) - 2)  # [e^-2, e^2]
    dtype = draw(st.sampled_from(dtypes))
    return OtbCase(rewards, energy, mask, layout.group_ids, weights, dtype, draw(st.booleans()), seed)


def _otb_checks(case: OtbCase) -> None:
    adv = case.call()
    batch, length = case.energy.shape
    assert adv.shape == (batch, length) and adv.dtype == compute_dtype_of(case.dtype) and not adv.requires_grad
    assert bool(torch.isfinite(adv).all()), adv
    valid = case.mask.bool()
    assert bool((adv[~valid] == 0).all()), "advantage where mask = 0"
    rewards = case.rewards.to(case.dtype).to(adv.dtype)
    nan_rows = torch.isnan(rewards)
    assert bool((adv[nan_rows] == 0).all()), "advantage on a NaN-reward row"
    # a group with exactly one scored member has baseline 0: A = G_i on its valid tokens
    dense = dense_of(case.group_ids)
    for g in range(int(dense.max()) + 1):
        rows = torch.nonzero((dense == g) & ~nan_rows).flatten()
        if rows.numel() == 1:
            i = int(rows[0])
            expected = torch.where(valid[i], rewards[i], torch.zeros_like(rewards[i]))
            assert torch.equal(adv[i], expected), "group of one scored member must have baseline 0"


@hsettings(60)
@given(case=otb_cases())
def test_otb_advantages_finite_and_zero_where_masked(case):
    _otb_checks(case)


@hsettings(12)
@given(case=otb_cases(big=True))
def test_otb_advantages_finite_and_zero_where_masked_group_of_64(case):
    _otb_checks(case)


@hsettings(40)
@given(
    case=otb_cases(dtypes=PERM_DTYPES),
    perm_seed=st.integers(0, 2**31 - 1),
)
def test_otb_advantages_permutation_equivariant(case, perm_seed):
    gen = torch.Generator().manual_seed(perm_seed)
    ids = case.group_ids
    perm = group_permutation(gen, ids)
    ids_p = _relabel(gen, dense_of(ids))[perm]
    assert_close(case.call(perm, ids_p), case.call()[perm], RTOL[case.dtype], "otb advantages")
