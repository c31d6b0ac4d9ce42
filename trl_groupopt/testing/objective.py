"""A registered method's objective as a function of tensors, and the objective contract (`trl_groupopt.testing`)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ..core.common import ObjectiveOutput, clipped_surrogate_loss
from ..methods.registry import METHODS
from ..trainer.loss import aggregate
from .host_sync import HostSyncError, no_host_sync
from .inputs import (
    FLOAT32_RTOL,
    FLOAT64_RTOL,
    GROUP_SIZE,
    SEEDS,
    Case,
    Property,
    extreme_cases,
    mismatch,
    permuted_within_groups,
    random_case,
    run_properties,
)


class _OneProcess:
    """The accelerator of a single process: collectives return their input."""

    num_processes, process_index, device = 1, 0, torch.device("cpu")

    def reduce(self, tensor: Tensor, reduction: str = "sum") -> Tensor:
        return tensor

    def gather(self, tensor: Tensor) -> Tensor:
        return tensor


@dataclass(frozen=True)
class BoundObjective:
    """A registered method's objective under its default config: ``loss(logps, old, advantages, mask)`` is the
    aggregated 0-dim loss, ``output`` the objective's own `ObjectiveOutput`."""

    name: str
    config: Any
    host: Any  # the stand-in trainer
    applies_token_weights: bool

    def output(self, logps: Tensor, old: Tensor, advantages: Tensor, mask: Tensor) -> ObjectiveOutput:
        group_ids = torch.arange(mask.shape[0], device=mask.device) // GROUP_SIZE  # (B,) consecutive groups
        inputs = {"completion_mask": mask, "advantages": advantages, "group_ids": group_ids}
        keywords = {"token_weights": None} if self.applies_token_weights else {}
        return type(self.host).objective(self.host, logps, old, advantages, mask, inputs, **keywords)

    def loss(self, logps: Tensor, old: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        return aggregate_as_trainer(self.output(logps, old, advantages, mask).per_token_loss, mask, self.config)


def aggregate_as_trainer(per_token_loss: Tensor, mask: Tensor, config: Any) -> Tensor:
    """The trainer's `loss_type` aggregation of one micro-batch on one process, no accumulation (0-dim)."""
    normalizer = mask.sum().clamp(min=1.0)  # "dapo": the window's token count, here this micro-batch's
    return aggregate(per_token_loss, mask, config.loss_type, 1.0, mask.shape[1], normalizer)[0]


def bind_objective(name: str, **overrides: Any) -> BoundObjective:
    """Method `name`'s objective under its default config (with `overrides`), on a stand-in trainer: an objective
    reads its settings from the config (`self.args`) and what TRL derives from it, never from state its trainer's
    `__init__` builds (no model, optimizer or data here)."""
    spec = METHODS.lookup(name)
    with tempfile.TemporaryDirectory() as folder:  # the config reads no file; nothing is written there
        config = spec.make_config(output_dir=folder, bf16=False, report_to="none", **overrides)
    trainer_class = spec.trainer_class
    host = object.__new__(trainer_class)  # no __init__: no model, no TRL state
    # mirrors GRPOTrainer.__init__ (trl 1.16.0): the attributes it derives from the config that an objective reads
    host.args, host.loss_type, host.beta = config, config.loss_type, config.beta
    host.epsilon_low = config.epsilon
    host.epsilon_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    host.importance_sampling_level = config.importance_sampling_level
    host.num_generations = host.num_generations_eval = GROUP_SIZE
    host.model = SimpleNamespace(training=True)  # training mode: `group_size` is `num_generations`
    host.accelerator, host.current_gradient_accumulation_steps = _OneProcess(), 1
    applies = bool(getattr(trainer_class, "objective_applies_token_weights", False))
    return BoundObjective(name, config, host, applies)


def loss_and_grad(objective: BoundObjective, case: Case, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """The aggregated loss (0-dim) and its gradient with respect to the (B, T) log-probs."""
    logps, old, advantages, mask = case.tensors(dtype)
    leaf = logps.clone().requires_grad_(True)
    loss = objective.loss(leaf, old, advantages, mask)
    grad = torch.autograd.grad(loss, leaf, allow_unused=True)[0] if loss.requires_grad else None
    return loss.detach(), torch.zeros_like(leaf) if grad is None else grad


def _gradient_sign(objective: BoundObjective) -> list[str]:
    failures, coupled = [], getattr(type(objective.host), "gradient_couples_tokens", None)
    for seed in SEEDS:
        case = random_case(seed, on_policy=True)
        _, grad = loss_and_grad(objective, case)
        if coupled:  # descent must still raise sum A log p: the whole gradient points against the advantages
            alignment = float((grad * case.advantages[:, None] * case.mask).sum())
            if not alignment < 0:
                failures.append(f"{case.label}: sum of A * d loss / d log p is {alignment:+.3g} ({coupled})")
            continue
        wrong = case.mask.bool() & (grad.sign() != -case.advantages.sign()[:, None])
        if wrong.any():
            b, t = (int(i) for i in wrong.nonzero()[0])
            failures.append(f"{case.label}: {int(wrong.sum())} valid tokens, e.g. row {b} position {t}: advantage "
                            f"{float(case.advantages[b]):+.3g}, d loss / d log p {float(grad[b, t]):+.3g}")  # fmt: skip
    return failures


def _equals_grpo_on_policy(objective: BoundObjective) -> list[str]:
    host, config, failures = objective.host, objective.config, []
    for seed in SEEDS:
        case = random_case(seed, on_policy=True)
        logps, old, advantages, mask = case.tensors()
        leaf = logps.clone().requires_grad_(True)
        reference = clipped_surrogate_loss(leaf, old, advantages, mask, epsilon_low=host.epsilon_low,
                                           epsilon_high=host.epsilon_high, delta=config.delta,
                                           importance_sampling_level=config.importance_sampling_level)  # fmt: skip
        want_loss = aggregate_as_trainer(reference.per_token_loss, mask, config)
        (want_grad,) = torch.autograd.grad(want_loss, leaf)
        loss, grad = loss_and_grad(objective, case)
        for what, got, want in (("loss", loss, want_loss.detach()), ("gradient", grad, want_grad)):
            if (problem := mismatch(got, want, FLOAT64_RTOL)) is not None:
                failures.append(f"{case.label}: the {what} is {problem} against TRL's clipped surrogate at ratio 1")
    return failures


def _masked_tokens(objective: BoundObjective) -> list[str]:
    failures = []
    for seed in SEEDS:
        case = random_case(seed)
        loss, grad = loss_and_grad(objective, case)
        masked = ~case.mask.bool()
        if (grad[masked] != 0).any():
            failures.append(f"{case.label}: {int((grad[masked] != 0).sum())} masked tokens get a nonzero gradient "
                            f"(largest {float(grad[masked].abs().max()):.3g})")  # fmt: skip
            continue
        g = torch.Generator().manual_seed(seed + 100)
        other = case.where_masked(-torch.rand(case.logps.shape, generator=g, dtype=torch.float64) * 30,
                                  -torch.rand(case.logps.shape, generator=g, dtype=torch.float64) * 30)  # fmt: skip
        other_loss, other_grad = loss_and_grad(objective, other)
        if not (torch.equal(loss, other_loss) and torch.equal(grad, other_grad)):
            failures.append(f"{case.label}: other log-probs at the masked tokens change the loss by "
                            f"{float((other_loss - loss).abs()):.3g}, the gradient by "
                            f"{float((other_grad - grad).abs().max()):.3g}")  # fmt: skip
    return failures


def _float32_agrees(objective: BoundObjective) -> list[str]:
    failures = []
    for seed in SEEDS:
        case = random_case(seed)
        (loss64, grad64), (loss32, grad32) = (loss_and_grad(objective, case, dtype) for dtype in (torch.float64,
                                                                                                 torch.float32))  # fmt: skip
        for what, got, want in (("loss", loss32, loss64), ("gradient", grad32, grad64)):
            if (problem := mismatch(got, want, FLOAT32_RTOL)) is not None:
                failures.append(
                    f"{case.label}: the float32 {what} is {problem} against float64's (rtol {FLOAT32_RTOL})"
                )
    return failures


def _finite_at_extremes(objective: BoundObjective) -> list[str]:
    failures = []
    for case in extreme_cases():
        loss, grad = loss_and_grad(objective, case, torch.float32)
        if not (torch.isfinite(loss) and torch.isfinite(grad).all()):
            failures.append(f"{case.label}: loss {float(loss):.3g}, {int((~torch.isfinite(grad)).sum())} non-finite "
                            "gradient entries")  # fmt: skip
    return failures


def _no_host_sync(objective: BoundObjective) -> list[str]:
    case = random_case(SEEDS[0])
    logps, old, advantages, mask = case.tensors(torch.float32)
    try:
        with no_host_sync():
            objective.output(logps.clone().requires_grad_(True), old, advantages, mask)
    except HostSyncError as error:
        return [f"{case.label}: the objective ran {error}, which waits for the device"]
    return []


def _row_permutation(objective: BoundObjective) -> list[str]:
    failures = []
    for seed in SEEDS:
        case = random_case(seed)
        permuted, order = permuted_within_groups(case, seed)
        rows, permuted_rows = (
            (objective.output(*c.tensors()).per_token_loss.detach() * c.mask).sum(-1) for c in (case, permuted)
        )  # (B,) each
        if (problem := mismatch(permuted_rows, rows[order], FLOAT64_RTOL)) is not None:
            failures.append(f"{permuted.label}: the per-row loss is {problem} against the original rows' permuted")
    return failures


#: The objective contract: (property, check).
OBJECTIVE_PROPERTIES: tuple[Property, ...] = (
    ("gradient sign", _gradient_sign),
    ("masked tokens", _masked_tokens),
    ("float32 agrees with float64", _float32_agrees),
    ("finite at extremes", _finite_at_extremes),
    ("no host sync", _no_host_sync),
    ("row permutation", _row_permutation),
)
EQUALS_GRPO = ("equals GRPO on-policy", _equals_grpo_on_policy)


def check_objective(name: str, **overrides: Any) -> None:
    """Check registered method `name`'s objective, under its default config (with `overrides`), against the contract
    (the module docstring); raise an `AssertionError` naming each property that fails and the input that shows it."""
    objective = bind_objective(name, **overrides)
    properties = OBJECTIVE_PROPERTIES
    if getattr(METHODS.lookup(name), "on_policy_equals", None) == "grpo":
        properties = (*properties, EQUALS_GRPO)
    run_properties(f"check_objective({name!r})", properties, objective)
