"""Logit-gradient energy from the forwards TRL already runs, for advantage estimators that need it (OTB's).

`GroupOptTrainer` mixes this in for every method and turns it on (`_enable_energy_capture`) only when its config's
advantage estimator declares `needs_energy`: otherwise TRL's fused head stays as TRL patched it and every override
below returns TRL's result at once (no recorder, no record, no extra output).

TRL computes log-probs with a fused, tiled LM head that can also return `log_sum_sq_probs = log sum_v p_v^2` (no
gradient) from the same tiles. `EnergyCaptureMixin` asks the head for that field and overrides
`_get_per_token_logps_and_entropies` so that every call records the energy beside the log-probs it returns: no second
forward, never a (B, T, V) tensor, no gradient through the energy, no module hook. The behaviour-policy forward (run
by TRL for `old_per_token_logps` when training is off-policy) puts its energy in the batch as `old_per_token_energy`,
the policy that sampled the completions, as verl does; on-policy TRL skips that forward and the training forward's
energy is used directly, which is then the same policy's. Off-policy the training forward's energy would be unused,
so that forward runs TRL's own head (log-probs and entropy only), which saves the energy's extra log-sum-exp over the
vocabulary. `rollout_energy(inputs)` is the energy an estimator reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from accelerate.utils import is_peft_model
from torch import Tensor
from trl.trainer.utils import add_fused_lm_head

from ..objectives.otb import energy_from_log_probs

__all__ = ["EnergyCaptureMixin"]


class _EnergyRecord(NamedTuple):
    """One `_get_per_token_logps_and_entropies` call: the log-probs it returned and their energy (None when the model
    called has no `log_sum_sq_probs` field, e.g. a separate reference model)."""

    per_token_logps: Tensor  # (B, T)
    energy: Tensor | None  # (B, T), detached


class _FusedOutputRecorder:
    """Stands in for the model during one `_get_per_token_logps_and_entropies` call and keeps each forward's
    `log_sum_sq_probs`. Calls and attribute reads go to the model (whatever wrapper it is: DDP, FSDP, PEFT) unchanged."""

    def __init__(self, model):
        self.model = model
        self.log_sum_sq_probs: list[Tensor | None] = []

    def __call__(self, *args, **kwargs):
        output = self.model(*args, **kwargs)
        self.log_sum_sq_probs.append(getattr(output, "log_sum_sq_probs", None))
        return output

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)


class EnergyCaptureMixin:
    """Mixed into `GroupOptTrainer` (before `LossMixin`): records the energy of every log-prob forward once
    `_enable_energy_capture` ran (see the module docstring)."""

    #: Whether the log-prob forwards record their energy (set by `_enable_energy_capture`).
    _energy_capture: bool = False

    def _enable_energy_capture(self) -> None:
        """Re-patch the fused LM head to also return `log_sum_sq_probs` and record it from now on (after TRL's
        `__init__`, which patched the head)."""
        # TRL's fused head computes only `log_probs` and `entropy`; re-patch it (TRL's public helper, applied on top of
        # TRL's own patch, to the module TRL patched) so that it also returns `log_sum_sq_probs` from the same tiles.
        # TRL's head is kept for the forwards whose energy is unused (`_lm_head_without_energy`).
        self._head_module = self.model.get_base_model() if is_peft_model(self.model) else self.model
        self._trl_head_forward = self._head_module.forward
        add_fused_lm_head(
            self._head_module,
            temperature=self.temperature,
            cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
            outputs=("log_probs", "entropy", "log_sum_sq_probs"),
        )
        self._otb_head_forward = self._head_module.forward
        self._energy_records: list[_EnergyRecord] = []
        self._training_energy: Tensor | None = None
        self._energy_capture = True

    def rollout_energy(self, inputs: dict[str, Any]) -> Tensor:
        """(B, T) energy of the policy that sampled `inputs`: the behaviour forward's off-policy, else the training
        forward's (then the same policy)."""
        energy = inputs.get("old_per_token_energy")
        return self._training_energy if energy is None else energy

    # ---- every log-prob forward records its energy
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's method, run with a recorder in place of `model`; records `(log-probs, energy)` of this call."""
        if not self._energy_capture:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        recorder = _FusedOutputRecorder(model)
        per_token_logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(
            recorder, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        fields = recorder.log_sum_sq_probs
        energy = None
        if fields and all(f is not None for f in fields):
            # mirrors TRL's `_get_per_token_logps_and_entropies`: `log_probs[:, -logits_to_keep:]` per chunk, concatenated
            log_sum_sq = torch.cat([f[:, -logits_to_keep:] for f in fields])  # (B, T)
            energy = energy_from_log_probs(per_token_logps, log_sum_sq)  # (B, T), detached
        self._energy_records.append(_EnergyRecord(per_token_logps, energy))
        return per_token_logps, entropies, aux_loss

    def _take_energy(self, per_token_logps: Tensor, forward: str) -> Tensor:
        """The energy recorded beside `per_token_logps` (the very tensor a recorded call returned); clears the records."""
        records, self._energy_records = self._energy_records, []
        for record in records:
            if record.per_token_logps is per_token_logps and record.energy is not None:
                return record.energy
        raise RuntimeError(
            f"OTB found no energy for the {forward} forward: TRL's `_get_per_token_logps_and_entropies` did not return "
            "the log-probs of a fused-head call with `log_sum_sq_probs`. This TRL version computes log-probs "
            "differently; please report it with your TRL version."
        )

    def _generate_and_score_completions(self, inputs):
        if not self._energy_capture:
            return super()._generate_and_score_completions(inputs)
        self._energy_records = []
        output = super()._generate_and_score_completions(inputs)
        old = output.get("old_per_token_logps")
        if old is not None:  # off-policy: the behaviour policy's energy, as a batch field
            output["old_per_token_energy"] = self._take_energy(old, "behaviour-policy")
        self._energy_records = []  # e.g. the reference forward's record
        return output

    @contextmanager
    def _lm_head_without_energy(self) -> Iterator[None]:
        """TRL's own fused head (log-probs and entropy, no `log_sum_sq_probs`) for the forwards inside."""
        self._head_module.forward = self._trl_head_forward
        try:
            yield
        finally:
            self._head_module.forward = self._otb_head_forward

    def _forward_logps_and_entropies(self, model, inputs):
        if not self._energy_capture:
            return super()._forward_logps_and_entropies(model, inputs)
        self._energy_records = []
        if "old_per_token_energy" in inputs:  # off-policy: the advantages use the behaviour policy's energy
            with self._lm_head_without_energy():
                output = super()._forward_logps_and_entropies(model, inputs)
            self._energy_records, self._training_energy = [], None
            return output
        per_token_logps, entropies, aux_loss = super()._forward_logps_and_entropies(model, inputs)
        self._training_energy = self._take_energy(per_token_logps, "training")
        return per_token_logps, entropies, aux_loss
