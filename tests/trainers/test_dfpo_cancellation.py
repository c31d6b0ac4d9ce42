"""DFPO's promise, checked where gradients actually flow (arXiv:2604.13088, Eq. 38, 85, Corollary H.1; docs/dfpo.md).

A token shared by every completion of a group is modelled as one scalar: column 0 of every row, so
``d loss / d shared = sum_i d loss / d logp_i0``. Everything is float64 and aggregated as the trainer does for the
loss_type under test (dapo: one batch constant per token; grpo: mean over sequences). Tolerance: 1e-12 relative to
GSPO's own shared-token gradient on the same batch.
"""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import nanstd

from tests.objectives.dfpo_logged import dfpo_logged as dfpo_loss
from tests.objectives.groups import groups_of
from trl_groupopt import DFPOConfig
from trl_groupopt.methods.dfpo.grpo_fix import symmetric_clip_loss

F64 = torch.float64
EPS_LOW, EPS_HIGH = 3e-4, 4e-4  # GSPO's, DFPOConfig's defaults
DEFAULT_LOSS_TYPE = DFPOConfig.__dataclass_fields__["loss_type"].default
DFPO_TRANSFORMS = ("min_replace", "orth_proj", "orth_proj_qp")


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    """GroupOptTrainer._aggregate for one micro-batch on one process, no accumulation."""
    mask = mask.to(per_token_loss.dtype)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dapo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "luspo":
        return (per_token_loss * mask).sum(-1).mean()
    raise AssertionError(loss_type)


def clipped_toy(group_size: int, seed: int, clip: bool, length: int = 7):
    """Two groups of ``group_size``: zero-sum advantages, ragged lengths, GSPO-sized log-ratios.

    With ``clip``, each group's largest-advantage member sits above 1 + eps_high (clipped) and, for groups of 8,
    its smallest-advantage member below 1 - eps_low (clipped); the others, and every member without ``clip``, lie
    inside the clip range. The unclipped members of each group keep both advantage signs.
    """
    gen = torch.Generator().manual_seed(seed)
    num_groups = 2
    batch = num_groups * group_size
    gids = torch.arange(num_groups).repeat_interleave(group_size) * 7 + 3
    while True:
        rewards = torch.randn(num_groups, group_size, generator=gen, dtype=F64)
        adv = (rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)
        keep = torch.ones_like(adv, dtype=torch.bool)
        keep.scatter_(1, adv.argmax(1, keepdim=True), False)
        if group_size >= 8:
            keep.scatter_(1, adv.argmin(1, keepdim=True), False)
        if all(bool((a[k] > 0).any() and (a[k] < 0).any()) for a, k in zip(adv, keep)):
            break
    mean_log_ratio = (torch.rand(num_groups, group_size, generator=gen, dtype=F64) - 0.5) * 4e-4  # |m| < 2e-4
    if clip:
        mean_log_ratio.scatter_(1, adv.argmax(1, keepdim=True), 1e-3)  # s = 1.001 > 1 + 4e-4, A > 0
        if group_size >= 8:
            mean_log_ratio.scatter_(1, adv.argmin(1, keepdim=True), -1e-3)  # s = 0.999 < 1 - 3e-4, A < 0
    adv, mean_log_ratio = adv.flatten(), mean_log_ratio.flatten()
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[:2] = torch.tensor([1, length])  # ragged for sure
    mask = (torch.arange(length) < lengths.unsqueeze(1)).to(F64)
    noise = 1e-4 * torch.randn(batch, length, generator=gen, dtype=F64) * mask
    noise = noise - (noise.sum(1, keepdim=True) / lengths.unsqueeze(1)) * mask  # zero mean over valid tokens
    old = -torch.rand(batch, length, generator=gen, dtype=F64) * 3
    logp = old + (mean_log_ratio.unsqueeze(1) + noise) * mask
    return logp, old, adv, mask, gids


def shared_grad(logp, old, adv, mask, gids, loss_type, **kwargs):
    """(d loss / d shared token, its gross scale sum_i |d loss / d logp_i0|, metrics) under ``loss_type``."""
    leaf = logp.clone().requires_grad_(True)
    kwargs = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, loss_type=loss_type, **kwargs)
    out = dfpo_loss(leaf, old, adv, mask, groups_of(gids), **kwargs)
    aggregate(out.per_token_loss, mask, loss_type).backward()
    return leaf.grad[:, 0].sum().item(), leaf.grad[:, 0].abs().sum().item(), out.metrics


def test_default_loss_type_is_one_that_cancels():
    assert DEFAULT_LOSS_TYPE in ("dapo", "luspo", "dr_grpo", "bnpo")


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("transform", ["orth_proj", "orth_proj_qp"])
def test_unclipped_cancels_under_clipping(group_size, transform):
    batch = clipped_toy(group_size, seed=group_size, clip=True)
    logp, old, adv, mask, gids = batch
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    clipped = ((adv >= 0) & (s > 1 + EPS_HIGH)) | ((adv < 0) & (s < 1 - EPS_LOW))
    assert all(bool(clipped[gids == g].any()) for g in gids.unique())  # >= 1 clipped member per group

    gspo, _, gspo_metrics = shared_grad(*batch, DEFAULT_LOSS_TYPE, transform="none")
    assert abs(gspo) > 1e-3
    assert gspo_metrics["dfpo/cancellation_residual"] > 0.05  # GSPO's own residual on the clipped toy
    unclipped, _, metrics = shared_grad(*batch, DEFAULT_LOSS_TYPE, transform=transform, orthogonal_over="unclipped")
    assert abs(unclipped) <= 1e-12 * abs(gspo)
    assert metrics["dfpo/cancellation_residual"] < 1e-6
    # the paper's constraint over the whole group counts the clipped member and does not cancel
    over_all, _, metrics_all = shared_grad(*batch, DEFAULT_LOSS_TYPE, transform=transform)
    assert abs(over_all) > 1e-3 * abs(gspo) and metrics_all["dfpo/cancellation_residual"] > 1e-3


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("transform", DFPO_TRANSFORMS)
def test_default_settings_cancel_without_clipping(group_size, transform):
    batch = clipped_toy(group_size, seed=10 + group_size, clip=False)
    # In the linear region GSPO's ratios are all ~1, so its own shared-token gradient is small but not zero:
    # compare with the gross scale of the per-member terms (exact cancellation = rounding of that sum).
    gspo, _, gspo_metrics = shared_grad(*batch, DEFAULT_LOSS_TYPE, transform="none")
    grad, gross, metrics = shared_grad(*batch, DEFAULT_LOSS_TYPE, transform=transform)
    assert abs(gspo) > 1e-6 * gross and gspo_metrics["dfpo/cancellation_residual"] > 1e-6
    assert abs(grad) <= 1e-12 * gross and abs(grad) <= 1e-10 * abs(gspo)
    assert metrics["dfpo/cancellation_residual"] < 1e-6
    # GSPO's recipe weighting (loss_type="grpo", 1/|y_i|) breaks it with ragged lengths, and the metric sees it
    grpo, grpo_gross, grpo_metrics = shared_grad(*batch, "grpo", transform=transform)
    assert abs(grpo) > 1e-2 * grpo_gross and grpo_metrics["dfpo/cancellation_residual"] > 1e-2


@pytest.mark.parametrize("shape", ["sequence", "token"])
@pytest.mark.parametrize("transform", DFPO_TRANSFORMS)
def test_importance_weights_enter_the_transform(shape, transform):
    """vLLM IS weights act on the effective coefficients s_bar_i w_i, so the cancellation includes them."""
    logp, old, adv, mask, gids = clipped_toy(4, seed=3, clip=False)
    gen = torch.Generator().manual_seed(0)
    size = (logp.shape[0], 1) if shape == "sequence" else logp.shape
    weights = (0.5 + torch.rand(size, generator=gen, dtype=F64)) * (mask if shape == "token" else 1)
    if transform != "min_replace":
        # TRL's sequence_mask / token_mask drops a sample: it leaves its group, which the projections rebalance
        # (min_replace cannot: like a clipped member, docs/dfpo.md)
        weights[1] = 0.0
    gspo, _, _ = shared_grad(
        logp, old, adv, mask, gids, DEFAULT_LOSS_TYPE, transform="none", importance_weights=weights
    )
    grad, gross, metrics = shared_grad(
        logp, old, adv, mask, gids, DEFAULT_LOSS_TYPE, transform=transform, importance_weights=weights
    )
    assert abs(gspo) > 1e-3 * gross and abs(grad) <= 1e-12 * gross
    assert metrics["dfpo/cancellation_residual"] < 1e-6
    # multiplying the weights after the transform (what the trainer did before) does not cancel
    leaf = logp.clone().requires_grad_(True)
    out = dfpo_loss(
        leaf, old, adv, mask, groups_of(gids), transform=transform, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH
    )
    aggregate(out.per_token_loss * weights, mask, DEFAULT_LOSS_TYPE).backward()
    assert abs(leaf.grad[:, 0].sum().item()) > 1e-3 * gross


@pytest.mark.parametrize("shape", ["sequence", "token"])
def test_none_with_importance_weights_is_trl(shape):
    """transform='none' with IS weights: TRL's GSPO loss times the weights, token by token, value and gradient."""
    logp, old, adv, mask, gids = clipped_toy(4, seed=5, clip=True)
    gen = torch.Generator().manual_seed(1)
    weights = torch.rand((logp.shape[0], 1) if shape == "sequence" else logp.shape, generator=gen, dtype=F64)
    for loss_type in ("grpo", "dapo"):
        ref = logp.clone().requires_grad_(True)
        coef_1 = torch.exp((((ref - old) * mask).sum(-1) / mask.sum(-1)).unsqueeze(-1))
        coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
        trl = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1)) * weights
        ref_total = aggregate(trl, mask, loss_type)
        ref_total.backward()
        leaf = logp.clone().requires_grad_(True)
        out = dfpo_loss(
            leaf, old, adv, mask, groups_of(gids), transform="none", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
            importance_weights=weights,
        )  # fmt: skip
        total = aggregate(out.per_token_loss, mask, loss_type)
        total.backward()
        torch.testing.assert_close(total, ref_total, rtol=1e-13, atol=0)
        torch.testing.assert_close(leaf.grad, ref.grad, rtol=1e-12, atol=1e-18)


@pytest.mark.parametrize("reward", [0.1, 0.3, 0.7, 1 / 3])
@pytest.mark.parametrize("transform", DFPO_TRANSFORMS)
def test_all_equal_reward_group_contributes_nothing(reward, transform):
    """TRL 1.16's advantage code (GRPOTrainer._generate_and_score_completions, float32, scale_rewards='group') on
    eight equal rewards gives same-sign noise of 1e-5..6e-4; every DFPO transform zeroes the group exactly, and
    "none" stays GSPO (it pushes the group)."""
    group = 8
    rewards = torch.cat([torch.full((group,), reward), torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])])  # + a real group
    grouped = rewards.view(-1, group)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group)
    std = nanstd(grouped, dim=1).repeat_interleave(group)
    advantages = (rewards - mean) / (std + 1e-4)  # float32, as TRL
    assert bool((advantages[:group] != 0).all())  # the float32 noise this test is about
    gen = torch.Generator().manual_seed(7)
    old = -torch.rand(2 * group, 5, generator=gen)
    logp = old + 1e-4 * torch.randn(2 * group, 5, generator=gen)
    mask = torch.ones(2 * group, 5)
    gids = torch.arange(2 * group) // group
    kwargs = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH)
    for name, expect_zero in ((transform, True), ("none", False)):
        leaf = logp.clone().requires_grad_(True)
        out = dfpo_loss(leaf, old, advantages, mask, groups_of(gids), transform=name, **kwargs)
        loss = out.per_token_loss[:group]
        aggregate(loss, mask[:group], DEFAULT_LOSS_TYPE).backward()
        if expect_zero:
            assert bool((loss == 0).all()) and bool((leaf.grad == 0).all())
            assert out.metrics["dfpo/shrink"] > 0.5  # the zeroed group is left out of the shrink average
        else:
            assert bool((loss != 0).all()) and bool((leaf.grad[:group] != 0).any())


def test_grpo_fix_default_loss_type_cancels_a_shared_token():
    """Corollary H.1: one ratio for the shared token across the group and sum_i A_i = 0 give zero gradient under
    GRPO-fix's default aggregation, with ragged lengths; loss_type='grpo' weighs by 1/|y_i| and does not cancel."""
    loss_type = DFPOConfig(
        output_dir="unused", dfpo_transform="symmetric_clip", use_cpu=True, report_to="none"
    ).loss_type
    gen = torch.Generator().manual_seed(2)
    batch, length = 4, 6
    old = -torch.rand(batch, length, generator=gen, dtype=F64)
    logp = old + 0.3 * torch.randn(batch, length, generator=gen, dtype=F64)
    for shared_log_ratio in (0.05, 0.5):  # inside and above the clip (r = 1.05, 1.65; eps_high 0.2)
        logp[:, 0] = old[:, 0] + shared_log_ratio
        adv = torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=F64)
        mask = (torch.arange(length) < torch.tensor([[1], [6], [3], [4]])).to(F64)
        grads = {}
        for name in (loss_type, "grpo"):
            leaf = logp.clone().requires_grad_(True)
            out = symmetric_clip_loss(leaf, old, adv, mask, epsilon_high=0.2)
            aggregate(out.per_token_loss, mask, name).backward()
            grads[name] = leaf.grad[:, 0].sum().item()
        assert abs(grads[loss_type]) < 1e-15
        if shared_log_ratio < 0.2:  # inside the clip the shared token moves under grpo's 1/|y_i| weights
            assert abs(grads["grpo"]) > 1e-2


def test_unclipped_rejected_where_it_cannot_hold(tmp_path):
    """`DFPOConfig` refuses the settings the transforms cannot honour, naming its fields."""
    kwargs = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    for transform in ("none", "min_replace"):
        with pytest.raises(ValueError, match="Use dfpo_transform='orth_proj' or 'orth_proj_qp', or "
                                             "dfpo_orthogonal_over='all'"):  # fmt: skip
            DFPOConfig(dfpo_transform=transform, dfpo_orthogonal_over="unclipped", **kwargs)
    with pytest.raises(ValueError, match="dfpo_orthogonal_over must be one of"):
        DFPOConfig(dfpo_transform="orth_proj", dfpo_orthogonal_over="clipped", **kwargs)
    with pytest.raises(ValueError, match="epsilon_high must be a finite number > 0"):
        DFPOConfig(dfpo_transform="none", epsilon_high=float("inf"), **kwargs)


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("loss_type", [DEFAULT_LOSS_TYPE, "grpo"])
@pytest.mark.parametrize("transform", DFPO_TRANSFORMS)
def test_gspo_residual_is_the_residual_transform_none_leaves(transform, loss_type, clip):
    """`dfpo/cancellation_residual_gspo` (what the mechanism report compares DFPO's residual with) is exactly the
    residual GSPO (`transform="none"`) leaves on the same batch; DFPO's own residual is below it."""
    batch = clipped_toy(4, seed=21, clip=clip)
    _, _, gspo_metrics = shared_grad(*batch, loss_type, transform="none")
    _, _, metrics = shared_grad(*batch, loss_type, transform=transform)
    gspo = gspo_metrics["dfpo/cancellation_residual"]
    assert metrics["dfpo/cancellation_residual_gspo"] == gspo == gspo_metrics["dfpo/cancellation_residual_gspo"]
    assert gspo > 1e-6
    if loss_type == DEFAULT_LOSS_TYPE and not clip:  # the transforms cancel: DFPO's residual is ~0
        assert metrics["dfpo/cancellation_residual"] < 1e-6
