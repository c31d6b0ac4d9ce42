"""The off-policy rollout schedule (TRL-free: the CLI reads it before TRL is imported). TRL's default is on-policy:
every importance ratio is exactly 1, and methods whose mechanism acts on the ratios train as plain GRPO."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar


def off_policy_schedule(updates_per_rollout: int, gradient_accumulation_steps: int) -> dict[str, int]:
    """The schedule fields that split each rollout into `updates_per_rollout` optimizer steps."""
    return {
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "steps_per_generation": updates_per_rollout * gradient_accumulation_steps,
    }


@dataclass(repr=False)
class OffPolicyScheduleMixin:
    """Config mixin (before `GRPOConfig`): no schedule field set, `updates_per_rollout` optimizer steps a rollout."""

    #: Optimizer steps per rollout when the user sets no schedule (each config states its paper's).
    updates_per_rollout: ClassVar[int]

    num_iterations: int | None = field(
        default=None, metadata={"help": "Iterations per generation batch; unset: 1 (see the default schedule)."}
    )

    def __post_init__(self):
        user_schedule = (self.steps_per_generation, self.generation_batch_size, self.num_iterations)
        if all(value is None for value in user_schedule):
            schedule = off_policy_schedule(self.updates_per_rollout, self.gradient_accumulation_steps)
            self.steps_per_generation = schedule["steps_per_generation"]
        if self.num_iterations is None:
            self.num_iterations = 1
        super().__post_init__()


def warn_if_inert_on_policy(trainer_name: str, args: Any, inert: str | None) -> None:
    """Warn when `args` train on-policy and the trainer's mechanism is then `inert` (None: it acts on-policy too)."""
    # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): its condition for skipping the behaviour
    # forward (every importance ratio is then exactly 1)
    on_policy = args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0
    if inert is None or not on_policy or (args.use_vllm and args.vllm_importance_sampling_correction):
        return
    change = "steps_per_generation to a multiple k > 1 of gradient_accumulation_steps (or num_iterations > 1)."
    fix = f"Set {change}"
    if isinstance(args, OffPolicyScheduleMixin):
        fix = (
            f"Leave steps_per_generation, generation_batch_size and num_iterations unset ({type(args).__name__} then "
            f"uses {args.updates_per_rollout} optimizer steps per rollout), or set {change}"
        )
    warnings.warn(
        f"{trainer_name}: this schedule is on-policy (steps_per_generation={args.steps_per_generation}, "
        f"gradient_accumulation_steps={args.gradient_accumulation_steps}, num_iterations={args.num_iterations}): "
        f"every importance ratio is 1 and {inert}. {fix}",
        UserWarning,
        stacklevel=3,
    )


def check_dataset_holds_a_generation_batch(args: Any, train_dataset) -> None:
    """Raise when the training set has fewer prompts than one generation batch needs (TRL's `RepeatSampler` drops
    incomplete generation batches: the run would train zero steps without an error)."""
    if train_dataset is None or not hasattr(train_dataset, "__len__"):
        return
    prompts_needed = args.generation_batch_size // args.num_generations
    if len(train_dataset) < prompts_needed:
        raise ValueError(
            f"The training set holds {len(train_dataset)} prompts but one generation batch needs {prompts_needed} "
            f"(generation_batch_size={args.generation_batch_size} = per_device_train_batch_size x processes x "
            f"steps_per_generation={args.steps_per_generation}, over num_generations={args.num_generations}): TRL "
            "would train zero steps. Use more prompts, or a smaller steps_per_generation (it defaults to several "
            "optimizer steps per rollout)."
        )


def schedule_text(args, config_class: type) -> str:
    """``2 optimizer steps per rollout``, with the config's own default where it differs (``(ECHOConfig's default in
    Python: 8)``): the command line's schedule (`RUN_DEFAULTS`) is not the Python API's for every method."""
    updates = args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps
    text = f"{updates} optimizer step{'s' * (updates != 1)} per rollout"
    own = getattr(config_class, "updates_per_rollout", None)
    return text if own in (None, updates) else f"{text} ({config_class.__name__}'s default in Python: {own})"
