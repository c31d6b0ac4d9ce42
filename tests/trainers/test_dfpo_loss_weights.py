"""DFPO with TRL's per-token loss multipliers, in the trained objective (`DFPOTrainer._compute_loss`), float64.

A member masked out by the off-policy mask (or by a vLLM IS `*_mask` mode, or without a high-entropy token) has
zero coefficient: it leaves its group, like a member without valid tokens, and `dfpo_orthogonal_over="unclipped"`
ranges over the members that carry gradient (clipped and masked ones excluded). The entropy mask and the IS weights
weigh sequence `i` by the mean of its multipliers over its valid tokens (a (B, 1) loss times (B, T) multipliers);
that weight enters the transform. Then a token shared by every completion of a group gets no gradient from it
(arXiv:2604.13088, Eq. 85), and `dfpo/cancellation_residual` reads ~0; GSPO (`"none"`) does not cancel, and its
residual counts the masks (docs/dfpo.md).

The forward is replaced by a float64 leaf of per-token log-probs (and fixed entropies), so the shared token is
column 0 of every row: `d loss / d shared = sum_i d loss / d logp_i0` (as in tests/trainers/test_dfpo_cancellation.py,
whose toy groups this file reuses), with everything else, masks included, computed by the trainer.
"""

from __future__ import annotations

from types import MethodType

import pytest
import torch

from tests.helpers import clone_model, cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from tests.objectives.groups import groups_of
from tests.trainers.test_dfpo_cancellation import EPS_HIGH, EPS_LOW, clipped_toy
from trl_groupopt import DFPOConfig, DFPOTrainer
from trl_groupopt.methods.dfpo.objective import dfpo_loss

F64 = torch.float64
GROUP = 4
OFF_POLICY_LOG_S = -2.5e-4  # mean log-ratio of the masked members: KL 2.5e-4 > the threshold, inside the clip
OFF_POLICY_THRESHOLD = 2.2e-4  # the toy's other members have |mean log-ratio| < 2e-4
MULTIPLIERS = {  # name -> (config overrides, vLLM IS weights: None, "sequence" or "token")
    "off_policy_mask": ({"off_policy_mask_threshold": OFF_POLICY_THRESHOLD}, None),
    "entropy_mask": ({"top_entropy_quantile": 0.5}, None),
    "vllm_is_sequence_mask": ({}, "sequence"),
    "vllm_is_token_truncate": ({}, "token"),
    "all_three": ({"off_policy_mask_threshold": OFF_POLICY_THRESHOLD, "top_entropy_quantile": 0.5}, "token"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=3), tmp_path_factory.mktemp("dfpo_weights")


def _trainer(tiny, name: str, is_weights: str | None, **overrides) -> DFPOTrainer:
    tokenizer, model, tmp = tiny
    args = DFPOConfig(**cpu_config_kwargs(tmp / name, per_device_train_batch_size=2 * GROUP, num_generations=GROUP,
                                          **overrides))  # fmt: skip
    trainer = DFPOTrainer(
        clone_model(model), length_reward, args=args, train_dataset=tiny_dataset(8), processing_class=tokenizer
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    if is_weights is not None:  # as TRL sets them with use_vllm=True (no engine needed for `_compute_loss`)
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    return trainer


def _batch(is_weights: str | None, clip: bool, seed: int = 4):
    """Two groups of 4 (`clipped_toy`); in each, one negative-advantage member moved to the off-policy mask's side
    of the threshold; fixed entropies; with `is_weights`, TRL-shaped vLLM IS weights with a masked member."""
    logp, old, adv, mask, gids = clipped_toy(GROUP, seed=seed, clip=clip)
    lengths = mask.sum(1)
    for group in gids.unique():
        rows = torch.nonzero((gids == group) & (adv < 0)).flatten()
        row = rows[adv[rows].argmax()]  # not the group's most negative member (the clipped one when clip=True)
        shift = (OFF_POLICY_LOG_S - ((logp[row] - old[row]) * mask[row]).sum() / lengths[row]) * mask[row]
        logp[row] = logp[row] + shift
    gen = torch.Generator().manual_seed(seed)
    inputs = {
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "group_ids": gids,
        "num_items_in_batch": mask.sum(),
    }
    if is_weights is not None:
        size = (mask.shape[0], 1) if is_weights == "sequence" else mask.shape
        weights = 0.5 + 2.5 * torch.rand(size, generator=gen, dtype=F64)
        weights[2] = 0.0  # a sample TRL's *_mask mode drops
        inputs["importance_sampling_ratio"] = weights
        inputs["sampling_per_token_logps"] = old  # vLLM agreed with the trainer's behaviour forward
    entropies = torch.rand(mask.shape, generator=gen, dtype=F64) * mask
    return logp, entropies, inputs


def _trained(trainer: DFPOTrainer, logp, entropies, inputs):
    """`_compute_loss` with the forward replaced by the leaf `logp`: (d loss / d logp, logged metrics)."""
    leaf = logp.clone().requires_grad_(True)
    trainer._forward_logps_and_entropies = MethodType(lambda self, model, batch: (leaf, entropies, None), trainer)
    trainer._metrics["train"].clear()
    trainer._compute_loss(trainer.model, inputs).backward()
    return leaf.grad, {name: values[-1] for name, values in trainer._metrics["train"].items()}


def _shared(grad, gids):
    """(max over groups of |d loss / d shared token|, gross scale sum_i |d loss / d logp_i0|)."""
    per_group = torch.stack([grad[gids == g, 0].sum() for g in gids.unique()])
    return per_group.abs().max().item(), grad[:, 0].abs().sum().item()


@pytest.mark.parametrize("over", ["all", "unclipped"])
@pytest.mark.parametrize("transform", ["orth_proj", "orth_proj_qp"])
@pytest.mark.parametrize("name", list(MULTIPLIERS))
def test_shared_token_cancels_with_loss_multipliers(tiny, name, transform, over):
    """Nothing clipped: the members the multipliers drop leave their group, the others are re-balanced with their
    multiplier-weighted coefficients, so the shared token cancels to rounding (1e-12 of the gross per-member scale),
    whatever dfpo_orthogonal_over; GSPO on the same batch does not, and its residual sees it."""
    overrides, is_weights = MULTIPLIERS[name]
    logp, entropies, inputs = _batch(is_weights, clip=False)
    kwargs = dict(epsilon=EPS_LOW, epsilon_high=EPS_HIGH, **overrides)
    trainer = _trainer(tiny, f"{name}-{transform}-{over}", is_weights, dfpo_transform=transform,
                       dfpo_orthogonal_over=over, **kwargs)  # fmt: skip
    grad, metrics = _trained(trainer, logp, entropies, inputs)
    shared, gross = _shared(grad, inputs["group_ids"])
    assert gross > 1e-3
    assert shared <= 1e-12 * gross
    assert metrics["dfpo/cancellation_residual"] < 1e-6
    gspo_grad, gspo_metrics = _trained(_trainer(tiny, f"{name}-none", is_weights, dfpo_transform="none", **kwargs),
                                       logp, entropies, inputs)  # fmt: skip
    gspo_shared, gspo_gross = _shared(gspo_grad, inputs["group_ids"])
    assert gspo_shared > 1e-3 * gspo_gross and gspo_metrics["dfpo/cancellation_residual"] > 1e-3


def test_the_masks_act_on_the_toy(tiny):
    """The off-policy mask drops one member per group (zero gradient on its row) and the entropy mask weighs the
    members unequally: the cases above are not vacuous."""
    logp, entropies, inputs = _batch(None, clip=False)
    trainer = _trainer(tiny, "opm-check", None, dfpo_transform="orth_proj", epsilon=EPS_LOW, epsilon_high=EPS_HIGH,
                       off_policy_mask_threshold=OFF_POLICY_THRESHOLD)  # fmt: skip
    mask = inputs["completion_mask"]
    kept = trainer.get_off_policy_mask(inputs["advantages"].unsqueeze(1), logp, inputs["old_per_token_logps"], mask,
                                       OFF_POLICY_THRESHOLD).squeeze(1)  # fmt: skip
    assert [int((kept[inputs["group_ids"] == g] == 0).sum()) for g in inputs["group_ids"].unique()] == [1, 1]
    grad, _ = _trained(trainer, logp, entropies, inputs)
    assert bool((grad[kept == 0] == 0).all()) and bool((grad[kept == 1].abs().sum(1) > 0).all())
    high = trainer.get_high_entropy_mask(entropies, mask, 0.5).to(F64)
    share = (high * mask).sum(1) / mask.sum(1)  # each sequence's weight under the entropy mask
    assert share.min() < share.max()


@pytest.mark.parametrize("transform", ["orth_proj", "orth_proj_qp"])
def test_unclipped_cancels_with_clipped_and_masked_members(tiny, transform):
    """Clipped members (no gradient) and off-policy-masked members (no loss) together: "unclipped" ranges over the
    members that carry gradient and cancels; "all" counts the clipped members and does not."""
    logp, entropies, inputs = _batch(None, clip=True, seed=8)
    mask, adv, gids = inputs["completion_mask"], inputs["advantages"], inputs["group_ids"]
    s = torch.exp(((logp - inputs["old_per_token_logps"]) * mask).sum(1) / mask.sum(1))
    clipped = ((adv >= 0) & (s > 1 + EPS_HIGH)) | ((adv < 0) & (s < 1 - EPS_LOW))
    kept = DFPOTrainer.get_off_policy_mask(adv.unsqueeze(1), logp, inputs["old_per_token_logps"], mask,
                                           OFF_POLICY_THRESHOLD).squeeze(1)  # fmt: skip
    assert all(bool(clipped[gids == g].any() and (kept[gids == g] == 0).any()) for g in gids.unique())
    kwargs = dict(dfpo_transform=transform, epsilon=EPS_LOW, epsilon_high=EPS_HIGH,
                  off_policy_mask_threshold=OFF_POLICY_THRESHOLD)  # fmt: skip
    grad, metrics = _trained(_trainer(tiny, f"clip-{transform}", None, dfpo_orthogonal_over="unclipped", **kwargs),
                             logp, entropies, inputs)  # fmt: skip
    shared, gross = _shared(grad, inputs["group_ids"])
    assert shared <= 1e-12 * gross and metrics["dfpo/cancellation_residual"] < 1e-6
    grad_all, metrics_all = _trained(_trainer(tiny, f"clip-{transform}-all", None, **kwargs), logp, entropies, inputs)
    shared_all, gross_all = _shared(grad_all, inputs["group_ids"])
    assert shared_all > 1e-3 * gross_all and metrics_all["dfpo/cancellation_residual"] > 1e-3


def test_multiplying_the_mask_after_the_objective_does_not_cancel():
    """What the trainer did before: the transform saw the masked member, the mask zeroed its loss afterwards."""
    logp, _, inputs = _batch(None, clip=False)
    mask, adv, gids = inputs["completion_mask"], inputs["advantages"], inputs["group_ids"]
    kept = DFPOTrainer.get_off_policy_mask(adv.unsqueeze(1), logp, inputs["old_per_token_logps"], mask,
                                           OFF_POLICY_THRESHOLD)  # fmt: skip
    leaf = logp.clone().requires_grad_(True)
    groups = groups_of(gids)
    out = dfpo_loss(leaf, inputs["old_per_token_logps"], adv, mask, groups, transform="orth_proj", epsilon_low=EPS_LOW,
                    epsilon_high=EPS_HIGH)  # fmt: skip
    ((out.per_token_loss * kept * mask).sum() / mask.sum()).backward()
    shared, gross = _shared(leaf.grad, gids)
    assert shared > 1e-3 * gross


@pytest.mark.parametrize("name", list(MULTIPLIERS))
def test_gspo_residual_counts_the_multipliers(tiny, name):
    """`dfpo/cancellation_residual` for GSPO ("none") is |sum_i A_i c_i| / sum_i |A_i| c_i with c_i = s_i w_i, w_i
    the mean of sequence i's multipliers over its valid tokens (0: the member is out), averaged over groups."""
    overrides, is_weights = MULTIPLIERS[name]
    logp, entropies, inputs = _batch(is_weights, clip=False)
    trainer = _trainer(tiny, f"residual-{name}", is_weights, dfpo_transform="none", epsilon=EPS_LOW,
                       epsilon_high=EPS_HIGH, **overrides)  # fmt: skip
    _, metrics = _trained(trainer, logp, entropies, inputs)
    mask, adv, gids = inputs["completion_mask"], inputs["advantages"], inputs["group_ids"]
    multipliers = torch.ones_like(mask)
    if trainer.off_policy_mask_threshold is not None:
        multipliers = multipliers * trainer.get_off_policy_mask(adv.unsqueeze(1), logp, inputs["old_per_token_logps"],
                                                                mask, OFF_POLICY_THRESHOLD)  # fmt: skip
    if trainer.top_entropy_quantile < 1:
        multipliers = multipliers * trainer.get_high_entropy_mask(entropies, mask, 1 - trainer.top_entropy_quantile)
    if is_weights is not None:
        multipliers = multipliers * inputs["importance_sampling_ratio"]
    w = (multipliers * mask).sum(1) / mask.sum(1)
    s = torch.exp(((logp - inputs["old_per_token_logps"]) * mask).sum(1) / mask.sum(1))  # nothing clipped here
    c = s * w
    per_group = [(adv[gids == g] * c[gids == g]).sum().abs() / (adv[gids == g].abs() * c[gids == g]).sum()
                 for g in gids.unique()]  # fmt: skip
    expected = torch.stack(per_group).mean().item()
    assert metrics["dfpo/cancellation_residual"] == pytest.approx(expected, rel=1e-5)
    unweighted = torch.stack([(adv[gids == g] * s[gids == g]).sum().abs() / (adv[gids == g].abs() * s[gids == g]).sum()
                              for g in gids.unique()]).mean().item()  # fmt: skip
    assert abs(unweighted - expected) > 1e-3 * expected  # the multipliers change the residual on this batch
