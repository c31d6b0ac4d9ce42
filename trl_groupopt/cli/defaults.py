"""The training command's defaults (`trl_groupopt.cli.main`, `trl_groupopt.cli.script`, the benchmarks). They compose in layers,
each filling what the layers before it left unset: the command line; the `--config` YAML; with the embedded policy
only, :data:`EMBEDDED_POLICY_DEFAULTS`, the method's `demo_defaults` and fp32 on every device; :data:`RUN_DEFAULTS`
(bf16 for a named model where the device runs it natively, CPU without an accelerator); the config class's own
defaults."""

from __future__ import annotations

from ..trainer.schedule import off_policy_schedule

#: Every run, whatever the model: an off-policy schedule sized for one small device, readable logs.
RUN_DEFAULTS = dict(
    per_device_train_batch_size=16,  # 4 prompts x 4 completions: whole groups per micro-batch
    num_generations=4,
    # 2 optimizer steps per rollout of 2 micro-batches each: off-policy, so the ratios differ from 1
    **off_policy_schedule(updates_per_rollout=2, gradient_accumulation_steps=2),
    beta=0.0,
    logging_steps=5,
    report_to="none",
    seed=42,
)

#: The embedded tiny policy on the synthetic task: measured in docs/getting-started.md (18.0% -> 29.5-34.5% in 80 steps;
#: learning rates above ~2e-4 made it worse). A checkpoint every 20 steps, on a generation boundary (an exact resume).
EMBEDDED_POLICY_DEFAULTS = dict(
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    temperature=1.0,  # rollouts sample the unboxed answers too: the contrast the accuracy reward learns from
    max_completion_length=48,  # the task's completions need <= 46 tokens
    max_steps=80,
    save_strategy="steps",
    save_steps=20,
    save_total_limit=2,
    gradient_checkpointing=False,  # 1 M parameters: recomputation only costs time
    ddp_find_unused_parameters=False,  # every parameter is used: skip DDP's extra graph traversal (and its warning)
    logging_steps=2,
)

#: Everything the embedded-policy demo sets; the benchmarks start from it (they save no checkpoints).
DEMO_DEFAULTS = RUN_DEFAULTS | EMBEDDED_POLICY_DEFAULTS | {"bf16": False, "disable_tqdm": True, "save_strategy": "no"}
