"""Logit-gradient energy from the forwards TRL already runs (its fused LM head's `log_sum_sq_probs`), for estimators
that declare `needs_energy`: docs/otb.md, "Where the energy comes from"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model
from torch import Tensor
from trl.trainer.utils import add_fused_lm_head

from ..core.common import energy_from_log_probs


class _FusedOutputRecorder:
    """Stands in for the model (any wrapper) in one TRL log-prob call; keeps each forward's `log_sum_sq_probs`."""

    def __init__(self, model):
        self.model = model
        self.log_sum_sq_probs: list[Tensor | None] = []

    def __call__(self, *args, **kwargs):
        output = self.model(*args, **kwargs)
        self.log_sum_sq_probs.append(getattr(output, "log_sum_sq_probs", None))
        return output

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)


class EnergyCapture:
    """Built after TRL's `__init__` patched the head: re-patches the fused LM head (TRL's public helper) to return
    `log_sum_sq_probs` too, and keeps TRL's head for forwards whose energy is unused."""

    def __init__(self, trainer) -> None:
        self.head = trainer.model.get_base_model() if is_peft_model(trainer.model) else trainer.model
        self.trl_forward = self.head.forward
        add_fused_lm_head(
            self.head,
            temperature=trainer.temperature,
            cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
            outputs=("log_probs", "entropy", "log_sum_sq_probs"),
        )
        self.fused_forward = self.head.forward
        #: (log-probs, energy) of each TRL log-prob call; energy None for a model without `log_sum_sq_probs`
        self.records: list[tuple[Tensor, Tensor | None]] = []
        self.training_energy: Tensor | None = None

    def rollout_energy(self, inputs: dict[str, Any]) -> Tensor:
        """(B, T) energy of the policy that sampled `inputs` (on-policy: the training forward's)."""
        energy = inputs.get("old_per_token_energy")
        return self.training_energy if energy is None else energy

    def recorded(self, trl_method, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's `_get_per_token_logps_and_entropies` (`trl_method`), recording `(log-probs, energy)` of the call."""
        recorder = _FusedOutputRecorder(model)
        output = trl_method(recorder, input_ids, attention_mask, logits_to_keep, *args, **kwargs)  # (logps, ...)
        fields, energy = recorder.log_sum_sq_probs, None
        if fields and all(f is not None for f in fields):
            # mirrors GRPOTrainer._get_per_token_logps_and_entropies (trl 1.16.0): `log_probs[:, -logits_to_keep:]`
            # per chunk, concatenated
            log_sum_sq = torch.cat([f[:, -logits_to_keep:] for f in fields])  # (B, T)
            energy = energy_from_log_probs(output[0], log_sum_sq)  # (B, T), detached
        self.records.append((output[0], energy))
        return output

    def take(self, per_token_logps: Tensor, forward: str) -> Tensor:
        """The energy recorded beside `per_token_logps` (the very tensor); clears the records."""
        records, self.records = self.records, []
        for logps, energy in records:
            if logps is per_token_logps and energy is not None:
                return energy
        raise RuntimeError(
            f"The advantage estimator found no energy for the {forward} forward: TRL's `_get_per_token_logps_and_entropies` did not return "
            "the log-probs of a fused-head call with `log_sum_sq_probs`. This TRL version computes log-probs "
            "differently; please report it with your TRL version."
        )

    def add_behaviour_energy(self, output: dict[str, Any]) -> None:
        """Off-policy, put the behaviour policy's energy in TRL's batch; clears the records (e.g. the reference's)."""
        old = output.get("old_per_token_logps")
        if old is not None:
            output["old_per_token_energy"] = self.take(old, "behaviour-policy")
        self.records = []

    def training_forward(self, forward: Callable[[], tuple], inputs: dict[str, Any]) -> tuple:
        """The loss's forward (`forward()`), keeping the training energy on-policy; off-policy the rollout's energy
        is used, so TRL's own head runs it."""
        self.records = []
        if "old_per_token_energy" not in inputs:
            output = forward()
            self.training_energy = self.take(output[0], "training")
            return output
        self.head.forward = self.trl_forward
        try:
            output = forward()
        finally:
            self.head.forward = self.fused_forward
        self.records, self.training_energy = [], None
        return output
