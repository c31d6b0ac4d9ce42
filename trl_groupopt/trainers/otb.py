"""OTB: the optimal token baseline, from the logit-gradient energy, computed inside the log-prob forward.

Paper: Li et al., "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL", arXiv:2602.07078.
Formulas in `trl_groupopt.objectives.otb` (reference: verl's `compute_optimal_token_baseline_advantage`).

Where the energy comes from. TRL computes log-probs with a fused, tiled LM head that can also return
`log_sum_sq_probs = log sum_v p_v^2` (no gradient) from the same tiles. This trainer asks for that field and keeps
it from the forwards TRL already runs: no second forward, never a (B, T, V) float32 tensor, no gradient through the
energy. Off-policy (when TRL runs the behaviour-policy forward for `old_per_token_logps`), the energy is taken from
that forward, i.e. from the policy that sampled the completions, as verl does; on-policy TRL skips that forward and
the training forward's energy is used, which is then the same policy's.
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import is_peft_model
from torch import Tensor
from trl import GRPOConfig
from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head

from ..objectives.common import group_mean, masked_mean
from ..objectives.otb import energy_from_log_probs, otb_advantages
from ..registry import register_method
from .base import GroupOptTrainer, TokenSafeConfigMixin


@dataclass(repr=False)
class OTBConfig(TokenSafeConfigMixin, GRPOConfig):
    r"""
    Configuration class for [`OTBTrainer`].

    Inherits every parameter of [`trl.GRPOConfig`]; the policy loss is TRL's (set by `loss_type`,
    `importance_sampling_level`, `epsilon`...), only the advantages change: `A_it = G_i - b_t` with the optimal token
    baseline `b_t` of the group (raw rewards, no std normalisation).

    The paper's claim: OTB with a group of N=4 matches a group-mean baseline with N=32; `benchmarks/sample_efficiency.py`
    tests it here (OTB N=4 against GRPO N=4 and N=16 at equal prompts).

    Parameters:
        scale_rewards (`str`, *optional*, defaults to `"none"`):
            As the reference implementation (only TRL's logged advantages use it; OTB uses the raw rewards).
        otb_handle_zero_tail (`bool`, *optional*, defaults to `True`):
            Past the second-longest sequence of a group the longest one has nothing to compare with: its baseline is 0
            there (verl's `handle_zero_tail`).
    """

    scale_rewards: str = field(default="none", metadata={"help": "OTB uses raw rewards; as the reference, 'none'."})
    otb_handle_zero_tail: bool = field(
        default=True, metadata={"help": "Baseline 0 where only the group's longest sequence is still active."}
    )


class _EnergyCapture:
    """Collects the fused head's `(log_probs, log_sum_sq_probs)` inside a `with` block; outside it does nothing."""

    def __init__(self):
        self.items: list[tuple[Tensor, Tensor]] | None = None  # collecting while not None
        self.items_done: list[tuple[Tensor, Tensor]] = []  # what the last `with` block collected

    def __enter__(self):
        self.items = []
        return self

    def __exit__(self, *exc):
        self.items_done, self.items = self.items, None
        return False


def _keep_energy(target: torch.nn.Module, capture: _EnergyCapture, temperature: float, cast_lm_head_to_fp32: bool) -> None:
    """Make TRL's fused head also return `log_sum_sq_probs` and hand it to `capture`.

    `add_fused_lm_head` wraps the current forward (TRL's fused one, from `GRPOTrainer.__init__`): the outer wrapper
    handles `fused_lm_head=True` itself, with the extra output, and defers to the old forward otherwise (generation).
    We then wrap that forward (not a module hook: PEFT calls `base_model.forward` directly, bypassing hooks).
    """
    add_fused_lm_head(target, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32,
                      outputs=("log_probs", "entropy", "log_sum_sq_probs"))
    fused_forward = target.forward

    @functools.wraps(fused_forward)  # keep the signature: `generate` validates its kwargs against it
    def forward_keeping_energy(*args, **kwargs):
        output = fused_forward(*args, **kwargs)
        if capture.items is not None and isinstance(output, FusedCausalLMOutput):
            capture.items.append((output.log_probs.detach(), output.log_sum_sq_probs))
        return output

    target.forward = forward_keeping_energy


class OTBTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with OTB advantages (optimal token baseline from the logit-gradient energy)."""

    config_class = OTBConfig
    _tag_names = ["trl", "otb", "trl-groupopt"]
    _name = "OTB"
    _paper = {
        "title": "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL",
        "id": "2602.07078",
        "citation": textwrap.dedent("""\
            @article{li2026optimal,
                title        = {{The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL}},
                author       = {Yingru Li and Jiawei Xu and Ziniu Li and Jiacai Liu and Wei Liu and Yuxuan Tong and Longtao Zheng and Zhenghai Xue and Yaxiang Zhang and Tianle Cai and Ge Zhang and Qian Liu and Baoxiang Wang},
                year         = 2026,
                eprint       = {arXiv:2602.07078},
            }"""),
    }
    requires_whole_groups = True
    requires_raw_rewards = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._energy_capture = _EnergyCapture()
        target = self.model.get_base_model() if is_peft_model(self.model) else self.model
        _keep_energy(target, self._energy_capture, self.temperature, self.args.cast_lm_head_to_fp32)
        self._training_energy: Tensor | None = None

    # ---- energy from the behaviour-policy forward TRL runs for old_per_token_logps (off-policy)
    def _generate_and_score_completions(self, inputs):
        with self._energy_capture as capture:
            output = super()._generate_and_score_completions(inputs)
        old = output.get("old_per_token_logps")
        if old is not None:
            output["otb_energy"] = self._energy_matching(capture.items_done, old)
        return output

    @staticmethod
    def _energy_matching(items: list[tuple[Tensor, Tensor]], per_token_logps: Tensor) -> Tensor:
        """(B, T) energy of the captured fused forward whose log-probs are `per_token_logps`.

        TRL's scoring runs the behaviour forward first (in batch chunks), then possibly a reference forward through
        the same module (PEFT); the chunks whose concatenated log-probs equal `old_per_token_logps` are the ones.
        """
        num_rows, length = per_token_logps.shape
        for start in range(len(items)):
            rows, stop = 0, start
            while stop < len(items) and rows < num_rows:
                rows += items[stop][0].shape[0]
                stop += 1
            if rows != num_rows:
                continue
            logps = torch.cat([lp[:, -length:] for lp, _ in items[start:stop]])
            if torch.equal(logps, per_token_logps):
                log_sum_sq = torch.cat([lss[:, -length:] for _, lss in items[start:stop]])
                return energy_from_log_probs(logps, log_sum_sq)
        raise RuntimeError("OTB could not find the behaviour-policy forward's energy among TRL's scoring forwards.")

    # ---- energy from the training forward (on-policy)
    def _forward_logps_and_entropies(self, model, inputs):
        with self._energy_capture as capture:
            per_token_logps, entropies, aux_loss = super()._forward_logps_and_entropies(model, inputs)
        length = per_token_logps.shape[1]
        log_sum_sq = torch.cat([lss[:, -length:] for _, lss in capture.items_done])  # (B, T)
        self._training_energy = energy_from_log_probs(per_token_logps.detach(), log_sum_sq)
        return per_token_logps, entropies, aux_loss

    def compute_advantages(self, inputs: dict[str, Any], per_token_logps: Tensor, mask: Tensor) -> Tensor:
        energy = inputs.get("otb_energy", self._training_energy)  # (B, T), no gradient
        weights = inputs.get("importance_sampling_ratio")  # vLLM IS ratio: (B, T) or (B, 1), squared into e
        rewards = inputs["rewards"]  # (B,) raw, NaN where unscorable
        advantages = otb_advantages(
            rewards, energy, mask, inputs["group_ids"], handle_zero_tail=self.args.otb_handle_zero_tail,
            importance_weights=None if weights is None else weights.expand_as(mask).to(energy.dtype),
        )  # (B, T)
        self._log_otb_metrics(rewards, energy, advantages, mask, inputs["group_ids"])
        return advantages

    def _log_otb_metrics(self, rewards, energy, advantages, mask, group_ids) -> None:
        mode = "train" if self.model.training else "eval"
        valid = mask * (~torch.isnan(rewards)).unsqueeze(1)  # (B, T)
        returns = torch.nan_to_num(rewards).unsqueeze(1)  # (B, 1)
        baseline = returns - advantages  # (B, T) b_t where valid
        # Variance proxy: E[A^2 ||grad log p||^2] (the token gradient's second moment) vs the group-mean baseline's.
        group_adv = (returns.squeeze(1) - group_mean(returns.squeeze(1), group_ids)).unsqueeze(1)  # (B, 1)
        metrics = {
            "otb/energy_mean": masked_mean(energy, valid),
            "otb/baseline_mean": masked_mean(baseline, valid),
            "otb/adv_abs_mean": masked_mean(advantages.abs(), valid),
            "otb/grad_second_moment": masked_mean(advantages**2 * energy, valid),
            "otb/grad_second_moment_group_mean_baseline": masked_mean(group_adv**2 * energy, valid),
        }
        self._log_objective_metrics({k: v.detach() for k, v in metrics.items()}, mask, mode)


register_method(
    "otb",
    config_class=OTBConfig,
    trainer_class=OTBTrainer,
    paper="arXiv:2602.07078",
    headline_metric="otb/grad_second_moment",
    summary="advantages G_i - b_t with the optimal token baseline from the logit-gradient energy",
)
