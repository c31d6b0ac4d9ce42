"""A user's objective in one file, outside `trl_groupopt/` (issue 50's acceptance): a soft sigmoid gate on the token
ratio in place of PPO's clip, after the SAPO policy loss of verl (`sapo` in verl's `core_algos.py`; TRL's
`loss_type="sapo"`, arXiv:2511.20347)::

    gate(r) = sigmoid(tau * (r - 1)) * 4 / tau      tau = tau_pos where A > 0, else tau_neg
    loss    = -A * gate(r)

At r = 1 the gate's derivative in log r is 1 (sigmoid'(0) = 1/4): on-policy the gradient is TRL's clipped surrogate's,
-A per token, but the value is 2/tau times its (so no `on_policy_equals="grpo"`). It returns the loss tensor only: no
metric at all, no clip indicators. Registered with `trl-groupopt train --method sapo_like --import sapo_like` (this
folder on the path), or through an entry point."""

import torch
from torch import Tensor

from trl_groupopt import register_objective


@register_objective("sapo_like", knobs={"tau_pos": 1.0, "tau_neg": 1.05}, summary="soft gate instead of a clip")
def sapo_like(per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor, *,
              tau_pos: float, tau_neg: float) -> Tensor:  # fmt: skip
    """(B, T) per-token loss -A * gate(r), 0 off the mask."""
    valid = mask.bool()  # (B, T)
    log_ratio = torch.where(valid, per_token_logps - old_per_token_logps.detach(), 0.0).clamp(-20.0, 20.0)  # (B, T)
    adv = advantages.detach().unsqueeze(-1) if advantages.dim() == 1 else advantages.detach()  # (B, 1) or (B, T)
    tau = torch.where(adv > 0, tau_pos, tau_neg)  # (B, 1) or (B, T)
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * 4.0 / tau  # (B, T)
    return torch.where(valid, -adv * gate, 0.0)  # (B, T)
