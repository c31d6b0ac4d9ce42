"""The values `GroupOptTrainer._compute_loss` passes between its steps, and its pure helpers: TRL 1.16's per-token
loss weights, k3 KL and `loss_type` aggregation, as functions of tensors and settings (no trainer)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

# TRL's cispo/sapo/vespo replace the surrogate itself, so they cannot be combined with another objective.
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
TRL_SURROGATE_LOSS_TYPES = ("cispo", "sapo", "vespo")
#: The multimodal inputs TRL's loss forward passes on (`GRPOTrainer._compute_loss`, trl 1.16.0).
MULTIMODAL_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip


class TokenMultipliers(NamedTuple):
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
        """The token weights: (B, T) or (B, 1) product of the multipliers that are on (float, detached); None when
        all are off."""
        product = None
        for weight in self:
            if weight is not None:
                product = weight.detach() if product is None else product * weight.detach()
        return product if product is None or product.is_floating_point() else product.float()


class LossInputs(NamedTuple):
    """One micro-batch as the objective reads it (`GroupOptTrainer.loss_inputs`)."""

    per_token_logps: Tensor  # (B, T) the policy's log-probs, with gradient
    old_per_token_logps: Tensor  # (B, T) the behaviour policy's (on-policy: sg(per_token_logps))
    advantages: Tensor  # (B,) or (B, T), from the estimator
    mask: Tensor  # (B, T) the completion mask less tool results
    multipliers: TokenMultipliers  # TRL's per-token multipliers
    entropies: Tensor  # (B, T) token entropies of the policy
    aux_loss: Tensor | None  # () the MoE router loss, when enabled

    @property
    def objective_args(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What every objective takes first: (log-probs, old log-probs, advantages, mask)."""
        return self.per_token_logps, self.old_per_token_logps, self.advantages, self.mask


def forward_arguments(inputs: dict[str, Any], aux_loss: bool) -> tuple[tuple[Tensor, Tensor, int], dict[str, Any]]:
    """The positional and keyword arguments of TRL's loss forward (`_get_per_token_logps_and_entropies`)."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the arguments of its `_get_per_token_logps_and_entropies` call
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P + T)
    logits_to_keep = completion_ids.size(1)  # logits only for the completion tokens
    multimodal = {key: inputs.get(key) for key in MULTIMODAL_KEYS}
    return (input_ids, attention_mask, logits_to_keep), dict(
        compute_entropy=True, compute_aux_loss=aux_loss, **multimodal
    )


def k3_kl(per_token_logps: Tensor, ref_per_token_logps: Tensor) -> Tensor:
    """(B, T) k3 estimator of KL(pi_theta || pi_ref), TRL's form."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): `per_token_kl`
    delta = ref_per_token_logps - per_token_logps  # (B, T)
    return torch.exp(delta) - delta - 1


def aggregate(
    per_token_loss: Tensor, mask: Tensor, loss_type: str, accumulation: float, max_length: int, normalizer=None
) -> tuple[Tensor, Tensor]:
    """TRL 1.16's `loss_type` aggregation, scaled for gradient accumulation: (loss, detached policy loss), 0-dim.
    ``max_length``: `max_completion_length` ("dr_grpo"); ``normalizer``: "dapo"'s 0-dim token count of one
    accumulation window on one process, which already holds the accumulation."""
    # mirrors GRPOTrainer._compute_loss (trl 1.16.0): the `loss_type` branches (grpo, bnpo, dr_grpo, dapo, luspo)
    masked = per_token_loss * mask  # (B, T)
    if loss_type == "dapo":
        loss = masked.sum() / normalizer
        return loss, loss.detach()
    if loss_type == "grpo":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = masked.sum() / (per_token_loss.size(0) * max_length)
    else:  # "luspo": `validate_args` admits SUPPORTED_LOSS_TYPES only
        loss = masked.sum(-1).mean()
    return loss / accumulation, loss.detach()
