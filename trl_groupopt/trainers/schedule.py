"""The off-policy rollout schedule that ECHOConfig and CTPOConfig default to.

TRL's `GRPOConfig` defaults to an on-policy schedule (`steps_per_generation = gradient_accumulation_steps`,
`num_iterations = 1`): every optimizer step sees fresh samples, every importance ratio is exactly 1, and methods whose
mechanism is a clip of those ratios train as plain GRPO. Their papers instead take several optimizer steps per
rollout; `default_off_policy_schedule` gives a config that schedule unless the user chose one.
"""

from __future__ import annotations

from trl import GRPOConfig


def default_off_policy_schedule(config: GRPOConfig, updates_per_rollout: int) -> None:
    """Fill the schedule fields of `config` in place; call it before `GRPOConfig.__post_init__`.

    `num_iterations` must be declared `int | None = None` on the config (None: "not set by the user"). When none of
    `steps_per_generation`, `generation_batch_size` and `num_iterations` is set, each rollout is split into
    `updates_per_rollout` optimizer steps: `steps_per_generation = updates_per_rollout * gradient_accumulation_steps`
    (the generation batch is `updates_per_rollout` times the effective training batch). Otherwise the user's schedule
    is kept, and an unset `num_iterations` becomes TRL's 1.
    """
    user_schedule = (config.steps_per_generation, config.generation_batch_size, config.num_iterations)
    if all(value is None for value in user_schedule):
        config.steps_per_generation = updates_per_rollout * config.gradient_accumulation_steps
    if config.num_iterations is None:
        config.num_iterations = 1


def check_dataset_holds_a_generation_batch(args: GRPOConfig, train_dataset) -> None:
    """Raise when the training set has fewer prompts than one generation batch needs.

    TRL's `RepeatSampler` drops incomplete generation batches, so such a run would train zero steps without an error.
    The default off-policy schedules make generation batches 8-16 times the training batch: name the fix.
    """
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
