"""ECHO (clip at batch, learn at token): config and trainer. Equations: `trl_groupopt.methods.echo.objective`; docs/echo.md."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor
from trl import GRPOConfig
from trl.models.utils import disable_gradient_checkpointing

from ...core.common import ObjectiveOutput, check_choice, check_positive, compute_dtype
from ...core.numerics import ClipWindow, ratio_window_width
from ...trainer.base import GroupOptTrainer
from ...trainer.boundary import buffered_batches, micro_step
from ...trainer.config import AdvantageEstimatorConfigMixin, TokenSafeConfigMixin
from ...trainer.loss import LossInputs
from ...trainer.schedule import OffPolicyScheduleMixin
from .objective import echo_batch_ratio_coupling, echo_log_ratio_totals, echo_loss

BATCH_RATIO_SCOPES = ("step", "global", "micro_batch")
# Loss types with one normaliser shared by every micro-batch and process: the only ones for which the coupling of the
# "step" and "global" scopes is exact (docs/echo.md; TRL's per-token loss weights enter it, no restriction).
GLOBAL_SCOPE_LOSS_TYPES = ("dapo", "dr_grpo")


@dataclass(repr=False)
class ECHOConfig(TokenSafeConfigMixin, AdvantageEstimatorConfigMixin, OffPolicyScheduleMixin, GRPOConfig):
    r"""
    Configuration class for [`ECHOTrainer`]: every parameter of [`trl.GRPOConfig`], ECHO's batch clip of R (Eq. 7,
    default: the paper's `epsilon`) and token clip (Eq. 11). Which tokens form R (`batch_ratio_scope`): docs/echo.md.
    """

    #: The paper's schedule: a 512-prompt rollout trained in mini-batches of 64 prompts.
    updates_per_rollout: ClassVar[int] = 8

    batch_epsilon: float | None = field(default=None, metadata={"help": "Lower batch clip; default: epsilon."})
    batch_epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper batch clip; default: batch_epsilon."}
    )
    token_clip: bool = field(default=True, metadata={"help": "Keep the token-level clip of Eq. 11."})
    batch_ratio_scope: str | None = field(
        default=None, metadata={"help": "step | global | micro_batch; default: step when the configuration allows it."}
    )
    loss_type: str = field(default="dapo", metadata={"help": "Aggregation; ECHO uses token-mean (dapo)."})

    def __post_init__(self):
        super().__post_init__()
        if self.batch_epsilon is None:
            self.batch_epsilon = self.epsilon
        widths = dict(epsilon=self.epsilon, epsilon_high=self.epsilon_high, batch_epsilon=self.batch_epsilon)
        check_positive(**{name: width for name, width in widths.items() if width is not None})
        if self.batch_epsilon >= 1:  # the objective reads it as "no lower bound"; a config asks for one
            raise ValueError(
                f"batch_epsilon must be < 1 (the lower batch bound is 1 - batch_epsilon), got {self.batch_epsilon} "
                "(it defaults to epsilon: set batch_epsilon explicitly if epsilon >= 1 is intended)."
            )
        if self.batch_epsilon_high is None:  # after batch_epsilon's checks: an error names the value the user gave
            self.batch_epsilon_high = self.batch_epsilon
        check_positive(
            finite=True, reason=" (the upper batch bound is 1 + it)", batch_epsilon_high=self.batch_epsilon_high
        )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "ECHO's ratios are token-level (Eq. 8-11): set importance_sampling_level='token' "
                f"(got {self.importance_sampling_level!r})."
            )
        if self.batch_ratio_scope is None:  # the paper's "step" where exact, else the widest exact scope, warning
            exact = (scope for scope in ("step", "global") if not self._scope_problems(scope))
            self.batch_ratio_scope = next(exact, "micro_batch")
            if self.batch_ratio_scope != "step":
                warnings.warn(
                    f"ECHOConfig: batch_ratio_scope defaults to {self.batch_ratio_scope!r}, not the paper's 'step', "
                    f"because of {', '.join(self._scope_problems('step'))}. Set batch_ratio_scope explicitly to "
                    "silence this.",
                    UserWarning,
                    stacklevel=2,
                )
        check_choice("batch_ratio_scope", self.batch_ratio_scope, BATCH_RATIO_SCOPES)
        problems = self._scope_problems(self.batch_ratio_scope)
        if problems:
            raise ValueError(
                f"batch_ratio_scope={self.batch_ratio_scope!r} is exact only with one shared loss normaliser and (for "
                "'step') every optimizer step inside one generation batch; "
                f"incompatible: {', '.join(problems)}. Use batch_ratio_scope='micro_batch' or change those settings."
            )

    def clip_windows(self) -> tuple[ClipWindow, ...]:
        """The clips the forward's noise is measured against (`trl_groupopt/trainer/numerics.py`): the batch clip of
        log R, measured over a micro-batch (a wider scope averages more tokens: less noise), and the token clip."""
        batch = ClipWindow("batch_clip", ratio_window_width(self.batch_epsilon, self.batch_epsilon_high), "batch")
        if not self.token_clip:
            return (batch,)
        high = self.epsilon_high if self.epsilon_high is not None else self.epsilon
        return batch, ClipWindow("token_clip", ratio_window_width(self.epsilon, high))

    def _scope_problems(self, scope: str) -> list[str]:
        """The settings that make `scope` inexact (empty for "micro_batch", which works with every option)."""
        if scope == "micro_batch":
            return []
        problems = []
        if self.loss_type not in GLOBAL_SCOPE_LOSS_TYPES:
            problems.append(f"loss_type={self.loss_type!r} (use one of {GLOBAL_SCOPE_LOSS_TYPES})")
        if scope == "step" and (self.steps_per_generation * self.num_iterations) % self.gradient_accumulation_steps:
            problems.append(
                f"steps_per_generation * num_iterations = {self.steps_per_generation * self.num_iterations} not a "
                f"multiple of gradient_accumulation_steps = {self.gradient_accumulation_steps}"
            )
        return problems


class ECHOTrainer(GroupOptTrainer):
    """[`trl.GRPOTrainer`] with ECHO's objective: batch-level clip, token-level importance sampling."""

    config_class = ECHOConfig
    supports_delta = False
    inert_on_policy = "ECHO's batch clip never acts"
    gradient_couples_tokens = "Eq. 34: every token carries the coupling L = (1/N) sum r A through log R"
    # The wide scopes' coupling must count TRL's per-token loss weights, so echo_loss applies them (docs/echo.md).
    objective_applies_token_weights = True

    #: ({(global_step, micro-step) it serves}, echo_loss's totals) of the current optimizer step ("step" scope)
    _step_totals: tuple[set[tuple[int, int]], dict[str, Tensor]] | None = None

    def loss_inputs(self, model, inputs: dict[str, Any]) -> LossInputs:
        """The base's, after this optimizer step's totals ("step" scope, training, a step of several micro-batches):
        computed on its first micro-batch."""
        if self._step_spans_micro_batches():
            key = (self.state.global_step, micro_step(self))
            if self._step_totals is None or key not in self._step_totals[0]:
                batches, keys = self._step_micro_batches(inputs)
                self._step_totals = (keys, self._compute_step_totals(model, batches))
        return super().loss_inputs(model, inputs)

    def _step_micro_batches(self, inputs: dict[str, Any]) -> tuple[list[dict[str, Any]], set[tuple[int, int]]]:
        """The micro-batches of the optimizer step that starts with `inputs` (TRL serves micro-step k the buffered batch
        `k % steps_per_generation`; the config keeps a step inside one generation batch) and the (global_step,
        micro-step) keys they are served at; outside TRL's loop (nothing buffered), `inputs` alone, uncached."""
        buffered = buffered_batches(self)
        if buffered is None:
            return [inputs], set()
        first, length = micro_step(self), int(self.current_gradient_accumulation_steps)
        if buffered[first % len(buffered)] is not inputs:
            raise RuntimeError(
                "ECHO batch_ratio_scope='step' reads the optimizer step's micro-batches from TRL's buffered generation "
                "batch, but the current inputs are not the buffered batch of this micro-step (a custom "
                "`_prepare_inputs`?). Use batch_ratio_scope='global'."
            )
        micro_steps = range(first, first + length)
        return [buffered[k % len(buffered)] for k in micro_steps], {(self.state.global_step, k) for k in micro_steps}

    def _compute_step_totals(self, model, batches: list[dict[str, Any]]) -> dict[str, Tensor]:
        """`echo_loss`'s log_ratio_sum, token_count and coupling_sum over `batches` on every process: one no-grad forward
        per micro-batch, at the parameters its training forward will see (hence the same loss weights); none on the
        first optimizer step after a rollout, where those parameters are the behaviour policy's (docs/echo.md)."""
        forward = self._why_step_totals_need_a_forward(batches) is not None  # the same on every process
        parts = []
        # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): its no-grad behaviour forward (the
        # estimator's metrics are logged by the loss's own call of `compute_advantages`, not here)
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            self._metrics_discarded(),
        ):
            for batch in batches:
                if forward:
                    loss_inputs = super().loss_inputs(model, batch)  # the loss's forward and inputs, as it runs them
                else:  # the behaviour log-probs are the current ones: log r = 0, R = 1 (docs/echo.md)
                    loss_inputs = self.compute_loss_inputs(batch, _behaviour_log_probs(batch), entropies=None)
                parts.append((*loss_inputs.objective_args, loss_inputs.multipliers.product()))
        return _scope_totals(self.accelerator, parts, self.echo_settings, coupling=True)

    def _why_step_totals_need_a_forward(self, batches: list[dict[str, Any]]) -> str | None:
        """Why the step totals need a forward of `batches` (the step's buffered micro-batches), None where the buffer
        gives them: on the first optimizer step after a rollout nothing has changed the parameters since TRL's
        behaviour forward, so every token ratio is 1 (docs/echo.md, "The first optimizer step after a rollout")."""
        # mirrors GRPOTrainer._prepare_inputs (trl 1.16.0): it generates and scores a new generation batch, and so
        # computes the behaviour log-probs, at the micro-steps where `_step % generate_every == 0`
        if buffered_batches(self) is None:
            return "outside TRL's training loop: who computed the old log-probs is unknown"
        if micro_step(self) % (self.args.steps_per_generation * self.args.num_iterations):
            return "a later optimizer step of the rollout: the policy has moved since the behaviour forward"
        if self.top_entropy_quantile < 1.0:
            return "the entropy mask (top_entropy_quantile < 1) needs the current entropies, which TRL does not buffer"
        if self.estimator.needs_energy and any("old_per_token_energy" not in batch for batch in batches):
            return f"advantage_estimator={self.estimator.name!r} reads the energy of the training forward (on-policy)"
        return None

    def _step_spans_micro_batches(self) -> bool:
        """Whether R's set is wider than the processes' current micro-batches: the "step" scope in training, over an
        optimizer step of several micro-batches (a step of one is the processes' micro-batch: no extra forward)."""
        return (
            self.args.batch_ratio_scope == "step"
            and self.model.training
            and int(self.current_gradient_accumulation_steps) > 1
        )

    @property
    def echo_settings(self) -> dict[str, Any]:
        """`echo_loss`'s hyper-parameters from the config, by hand (TRL's resolved clip widths)."""
        args = self.args
        return dict(
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            token_clip=args.token_clip,
            batch_epsilon_low=args.batch_epsilon,
            batch_epsilon_high=args.batch_epsilon_high,
        )

    def objective(self, per_token_logps: Tensor, old_per_token_logps: Tensor, advantages: Tensor, mask: Tensor,
                  inputs: dict[str, Any], *, token_weights: Tensor | None = None) -> ObjectiveOutput:  # fmt: skip
        part = (per_token_logps, old_per_token_logps, advantages, mask, token_weights)
        settings, totals, scope = self.echo_settings, {}, self.args.batch_ratio_scope
        if self._step_spans_micro_batches():
            totals = self._step_totals[1]
        elif scope in ("step", "global"):  # a step of one micro-batch, and evaluation: "step" is the processes' batch
            totals = _scope_totals(self.accelerator, [part], settings, coupling=self.accelerator.num_processes > 1)
        return echo_loss(*part[:4], **settings, **totals, importance_weights=token_weights)


def _behaviour_log_probs(batch: dict[str, Any]) -> Tensor:
    """(B, T) log-probs of a buffered micro-batch under the behaviour policy: TRL's old log-probs; on-policy TRL
    buffers none, and any log-probs serve (the loss inputs take them as the old ones too: log r = 0 exactly)."""
    old = batch.get("old_per_token_logps")
    if old is not None:
        return old
    mask = batch["completion_mask"]
    return torch.zeros(mask.shape, dtype=compute_dtype(batch.get("advantages")), device=mask.device)


def _scope_totals(accelerator, parts: list[tuple], settings: dict[str, Any], coupling: bool) -> dict[str, Tensor]:
    """`echo_loss`'s log_ratio_sum and token_count (with `coupling`, its coupling_sum too) over the parts that form R,
    ``(log-probs, old log-probs, advantages, mask, loss weights)`` each, on every process."""
    local = sum(echo_log_ratio_totals(logps, old, mask) for logps, old, _, mask, _ in parts)  # (2,)
    totals = accelerator.reduce(local, reduction="sum")  # (2,) over processes
    out = dict(log_ratio_sum=totals[0], token_count=totals[1])
    if coupling:
        local = sum(echo_batch_ratio_coupling(*part, importance_weights=w, **settings, **out) for *part, w in parts)
        out["coupling_sum"] = accelerator.reduce(local.reshape(1), reduction="sum")[0]  # ()
    return out
