"""The loss of `GroupOptTrainer` as plain functions: TRL 1.16's `_compute_loss` (its loss weights, beta-KL, entropy
bonus, MoE aux loss, `loss_type` aggregation and metrics) around the trainer's `objective` and `compute_advantages`."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.common import log_importance_weights
from ..core.estimators import EstimatorInputs

# TRL's cispo/sapo/vespo replace the surrogate itself, so they cannot be combined with another objective.
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
TRL_SURROGATE_LOSS_TYPES = ("cispo", "sapo", "vespo")
_MULTIMODAL_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip


class LossWeights(NamedTuple):
    """TRL 1.16's per-token multipliers of the policy loss, in TRL's order; each None where off. No gradient."""

    off_policy_mask: Tensor | None  # (B, 1) 0/1, TRL's off-policy sequence mask
    entropy_mask: Tensor | None  # (B, T) bool, TRL's high-entropy token mask
    importance_weights: Tensor | None  # (B, T) or (B, 1), TRL's vLLM importance-sampling weights

    def apply(self, per_token_loss: Tensor) -> Tensor:
        for weight in self:
            if weight is not None:
                per_token_loss = per_token_loss * weight
        return per_token_loss

    def product(self) -> Tensor | None:
        """(B, T) or (B, 1) product of the multipliers that are on (float, detached); None when all are off."""
        product = None
        for weight in self:
            if weight is not None:
                product = weight.detach() if product is None else product * weight.detach()
        return product if product is None or product.is_floating_point() else product.float()


def estimator_inputs(trainer, inputs: dict[str, Any], mask: Tensor) -> EstimatorInputs:
    estimator = trainer.estimator
    energy = trainer._energy.rollout_energy(inputs) if estimator.needs_energy else None  # (B, T)
    weights = inputs.get("importance_sampling_ratio")  # vLLM IS ratio: (B, T) or (B, 1)
    if weights is not None:
        weights = weights.expand_as(mask).to(energy.dtype if energy is not None else weights.dtype)  # (B, T)
    rewards = inputs["rewards"] if estimator.needs_raw_rewards else None
    return EstimatorInputs(mask=mask, trl_advantages=inputs.get("advantages"), rewards=rewards, energy=energy,
                           group_ids=inputs.get("group_ids"), group_size=trainer.group_size, importance_weights=weights,
                           tool_use="tool_mask" in inputs)  # fmt: skip


def objective_inputs(trainer, model, inputs: dict[str, Any]) -> tuple[tuple[Tensor, ...], LossWeights, Tensor, Any]:
    """The loss's forward and what the objective reads: ``(log-probs, old log-probs, advantages, mask)``, TRL's loss
    weights, the entropies and the MoE aux loss (ECHO's step totals run it too)."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): `mask` (less tool results), old log-probs, and the off-policy
    # mask, entropy mask and vLLM IS blocks
    t = trainer
    mask = inputs["completion_mask"]  # (B, T)
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    per_token_logps, entropies, aux_loss = t._forward_logps_and_entropies(model, inputs)  # (B, T) each
    # On-policy TRL skips the behaviour forward: the ratio is then exactly 1 (old = sg(current)).
    old_per_token_logps = inputs.get("old_per_token_logps")
    if old_per_token_logps is None:
        old_per_token_logps = per_token_logps.detach()
    advantages = t.compute_advantages(inputs, per_token_logps, mask)  # (B,) or (B, T)
    off_policy_mask = entropy_mask = importance_weights = None
    if t.off_policy_mask_threshold is not None:
        off_policy_mask = t.get_off_policy_mask(  # (B, 1)
            advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,  # (B, 1) or (B, T)
            per_token_logps=per_token_logps, mask=mask, off_policy_threshold=t.off_policy_mask_threshold,
            sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_per_token_logps),
        )  # fmt: skip
    if t.top_entropy_quantile < 1.0:
        entropy_mask = t.get_high_entropy_mask(entropies, mask, 1 - t.top_entropy_quantile)  # (B, T)
    if t.use_vllm and t.vllm_importance_sampling_correction:
        importance_weights = inputs["importance_sampling_ratio"]  # (B, T) or (B, 1)
    weights = LossWeights(off_policy_mask, entropy_mask, importance_weights)
    return (per_token_logps, old_per_token_logps, advantages, mask), weights, entropies, aux_loss


def policy_loss(trainer, model, inputs: dict[str, Any]) -> Tensor:
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): KL, entropy bonus, aux loss and metric names, in TRL's order
    # (the rest in `objective_inputs`); only the surrogate and advantages are pluggable
    t = trainer
    mode = "train" if t.model.training else "eval"
    objective_args, weights, entropies, aux_loss = objective_inputs(t, model, inputs)
    per_token_logps, old_per_token_logps, _, mask = objective_args
    if t.objective_applies_loss_weights:
        out = t.objective(*objective_args, inputs, loss_weights=weights.product())
        per_token_loss = out.per_token_loss
    else:
        out = t.objective(*objective_args, inputs)
        per_token_loss = weights.apply(out.per_token_loss)
    if t.beta != 0.0:
        per_token_kl = _per_token_kl(t, per_token_logps, old_per_token_logps, inputs["ref_per_token_logps"], mask)
        per_token_loss = per_token_loss + t.beta * per_token_kl
    loss, policy_loss = aggregate(t, per_token_loss, mask, inputs, mode)
    if t._entropy_bonus_enabled:
        effective_mask = mask if weights.entropy_mask is None else mask * weights.entropy_mask
        loss = loss - _entropy_bonus(t, entropies, effective_mask, mode)
        t._metrics[mode]["policy_loss"].append(t.accelerator.gather(policy_loss).nanmean().item())
    if t.aux_loss_enabled:
        accumulation = t.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss + t.router_aux_loss_coef * aux_loss / accumulation
        t._metrics[mode]["aux_loss"].append(t.accelerator.gather_for_metrics(aux_loss).mean().item())
    shared = {"entropy": entropies, **({"kl": per_token_kl} if t.beta != 0.0 else {})}  # (B, T) each
    t._metrics_queue.add({**out.metrics, **shared}, mask, mode)
    t._flush_metrics()  # this micro-batch's metrics (and any a hook queued): one collective, one sync
    return loss


def forward_logps_and_entropies(trainer, model, inputs: dict[str, Any]):
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): its `_get_per_token_logps_and_entropies` call
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    return trainer._get_per_token_logps_and_entropies(
        model, torch.cat([prompt_ids, completion_ids], dim=1), torch.cat([prompt_mask, completion_mask], dim=1),
        completion_ids.size(1),  # logits only for the completion tokens
        compute_entropy=True, compute_aux_loss=trainer.aux_loss_enabled, **{k: inputs.get(k) for k in _MULTIMODAL_KEYS},
    )  # fmt: skip


def _per_token_kl(trainer, per_token_logps, old_per_token_logps, ref_per_token_logps, mask) -> Tensor:
    """k3 estimator of KL(pi_theta || pi_ref), TRL's form; times the IS weight with `use_bias_correction_kl`."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): `per_token_kl` and its bias correction
    delta = ref_per_token_logps - per_token_logps  # (B, T)
    per_token_kl = torch.exp(delta) - delta - 1  # (B, T)
    if trainer.args.use_bias_correction_kl:
        log_weights = log_importance_weights(  # (B, T) or (B, 1), as the default objective's
            per_token_logps - old_per_token_logps, mask, trainer.importance_sampling_level
        )
        per_token_kl = per_token_kl * torch.exp(log_weights)
    return per_token_kl


def aggregate(trainer, per_token_loss: Tensor, mask: Tensor, inputs, mode: str) -> tuple[Tensor, Tensor]:
    """TRL 1.16's `loss_type` aggregation and gradient-accumulation scaling. Returns (loss, policy_loss)."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `loss_type` branches (grpo, bnpo, dr_grpo, dapo, luspo)
    accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accum in eval
    if trainer.loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif trainer.loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif trainer.loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * trainer.max_completion_length)
    elif trainer.loss_type == "luspo":
        loss = (per_token_loss * mask).sum(-1).mean()
    elif trainer.loss_type == "dapo":
        # `num_items_in_batch` counts the tokens of the whole generation batch on all processes: rescale it to
        # one accumulation window on one process (TRL's normaliser), so no further division by accumulation.
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * trainer.current_gradient_accumulation_steps / trainer.args.steps_per_generation
        loss = (per_token_loss * mask).sum() / normalizer
        return loss, loss.detach()
    else:  # validate_args rejects the others; kept for subclasses that bypass it
        raise ValueError(f"Unsupported loss_type {trainer.loss_type!r}; use one of {SUPPORTED_LOSS_TYPES}")
    return loss / accumulation, loss.detach()


def _entropy_bonus(trainer, entropies: Tensor, effective_mask: Tensor, mode: str) -> Tensor:
    """coef * mean token entropy, TRL 1.16's static or adaptive entropy bonus (to be subtracted from the loss)."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `_entropy_bonus_enabled` block and adaptive controller
    accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
    entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
    # The coefficient from the end of the previous optimizer step: every micro-batch of a window applies the same.
    apply_coef = trainer.entropy_coef
    if trainer.use_adaptive_entropy and trainer._last_world_entropy > trainer.args.entropy_target:
        apply_coef = 0.0
    if trainer.use_adaptive_entropy and mode == "train":
        _update_entropy_coef(trainer, entropies, effective_mask)
    if mode == "train" and trainer.accelerator.sync_gradients:
        trainer._metrics[mode]["entropy_coef"].append(trainer.entropy_coef)
    return apply_coef * entropy_loss


def _update_entropy_coef(trainer, entropies: Tensor, effective_mask: Tensor) -> None:
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `use_adaptive_entropy` block
    stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
    previous = trainer._entropy_window_stats
    trainer._entropy_window_stats = stats if previous is None else previous + stats
    if not trainer.accelerator.sync_gradients:  # not an optimizer-step boundary
        return
    totals = trainer.accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
    world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
    args = trainer.args
    if world_entropy <= args.entropy_target:
        trainer.entropy_coef = min(trainer.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
    else:
        trainer.entropy_coef = max(trainer.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
    trainer._last_world_entropy = world_entropy
    trainer._entropy_window_stats = None
