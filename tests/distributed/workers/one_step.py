"""Worker: one optimizer step of every trainer configuration on a FIXED generation batch.

Run on 1 process (the union of the data) and on 2 processes (each rank its contiguous half); the test compares the
logged loss, the gradients entering the optimizer and the updated parameters.

How the batch is fixed: `trl.GRPOTrainer._generate_and_score_completions` (the PARENT of our base's override) is
patched to return this rank's rows of `tests.distributed.batches.group_batch`, so our base still adds `group_ids`
(whole-group methods) and `rewards` (OTB) exactly as in a real run. The global per-function rewards are put on
`self._raw_rewards_per_func`, where TRL's `_calculate_rewards` would have left them. `old_per_token_logps` is the
initial model's log-probs minus a fixed log-ratio (`batches.log_ratios`), computed once over the whole global batch
on every rank; for advantages that need the behaviour policy's energy (an estimator with `needs_energy`, as OTB's:
the energy must come from the behaviour-policy forward, recorded beside its log-probs) the behaviour policy is instead
the initial model with fixed perturbed weights, run inside the patched call on the local rows.

Optimizer: plain SGD (momentum 0, constant learning rate, gradient clipping out of reach), so the update is
`p - lr * grad` and a scale error in the gradient shows in the parameters (AdamW's first step is sign-like).

Writes `rank{R}.json` ({"world_size", "cases": {name: {...logged values...}}}) and `rank{R}_tensors.pt`
({name: {"grads", "params", "initial"}}: parameter-name -> tensor dicts).
"""

import argparse
import gc
import os
import sys
from types import MethodType

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

import trl
from transformers import TrainerCallback, set_seed

from tests.distributed import batches
from tests.distributed.harness import write_result
from tests.helpers import (
    _forward,
    assert_registered,
    length_reward,
    method_config,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from tests.selection import tested_methods
from trl_groupopt import get_method

LEARNING_RATE = 0.5
OTB_WEIGHT_NOISE = 0.05  # std of the behaviour policy's weight perturbation (energy-based advantages only)
DFPO_EPS = dict(epsilon=0.05, epsilon_high=0.08)  # some sequence ratios clipped, some not ("mixed" scenario)
OTB_ADVANTAGES = dict(advantage_estimator="otb")  # a method's objective on OTB's advantages

#: registry name -> {case name: (config overrides, off-policy scenario or None)}: the configurations checked besides
#: every method's own case (named after it: its spec's `acting_settings`, where its mechanism acts). Case names start
#: with the registry name. Scenario None: "weights" where the advantages need the behaviour policy's energy (recorded
#: beside its log-probs, so the behaviour policy must be a real forward: perturbed weights), else "mixed".
VARIANTS = {
    "grpo": {  # the own case "grpo" is TRL's default loss_type, dapo
        f"grpo/{loss}": (dict(loss_type=loss, **({"importance_sampling_level": "sequence"} if loss == "luspo" else {})),
                         None)
        for loss in ("grpo", "bnpo", "dr_grpo", "luspo")
    },
    "echo": {
        **{f"echo/{scope}/{scenario}": (dict(batch_ratio_scope=scope), scenario)
           for scope, scenarios in (("micro_batch", ("split", "unclipped")), ("global", ("split", "shifted", "unclipped")))
           for scenario in scenarios},
        "echo/otb": (OTB_ADVANTAGES, None),  # the default ("step") scope on OTB's advantages
    },
    "dfpo": {
        f"dfpo/{t}": (dict(dfpo_transform=t, **DFPO_EPS), None) for t in ("min_replace", "orth_proj", "orth_proj_qp", "none")
    },
    "ctpo": {"ctpo/otb": (OTB_ADVANTAGES, None)},
    "grpo_fix": {"grpo_fix/otb": (OTB_ADVANTAGES, None)},
}  # fmt: skip


def cases_of(method: str) -> dict[str, tuple[dict, str | None]]:
    """The method's own case (its name: `acting_settings`), then its `VARIANTS`."""
    return {method: (dict(get_method(method).acting_settings), None), **VARIANTS.get(method, {})}


# name -> (registry name, config overrides, off-policy scenario or None)
CASES = {name: (method, *case) for method in tested_methods() for name, case in cases_of(method).items()}


def scenario_of(args, scenario: str | None) -> str:
    """The case's scenario, or the one its config's advantages need."""
    if scenario is not None:
        return scenario
    from trl_groupopt.core.estimators import ESTIMATORS

    estimator = ESTIMATORS.get(getattr(args, "advantage_estimator", "grpo"))
    return "weights" if estimator is not None and estimator.needs_energy else "mixed"


def fixed_generation(self, inputs):
    """Stand-in for `trl.GRPOTrainer._generate_and_score_completions`: this rank's slice of the fixed batch."""
    fixed = self._fixed
    batch, world = fixed["batch"], self.accelerator.num_processes
    num_rows = len(inputs)  # local generation batch (per_device_train_batch_size * steps_per_generation)
    assert num_rows * world == batches.NUM_ROWS, (num_rows, world)
    rows = slice(self.accelerator.process_index * num_rows, (self.accelerator.process_index + 1) * num_rows)
    device = self.accelerator.device
    output = {
        key: batch[key][rows].to(device)
        for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
    }
    output["num_items_in_batch"] = batch["num_items_in_batch"].to(device)  # global token count, as TRL gathers it
    self._raw_rewards_per_func = batch["rewards_per_func"].to(device)  # (N_global, F), as _calculate_rewards
    for key in ("sampling_per_token_logps", "importance_sampling_ratio"):  # vLLM's, where a test fixes them
        if key in fixed:
            output[key] = fixed[key][rows].to(device)
    if fixed["old_per_token_logps"] is not None:
        output["old_per_token_logps"] = fixed["old_per_token_logps"][rows].to(device)
    else:  # behaviour policy = perturbed weights, through the model's own (captured) forward, as TRL scores
        params = list(self.model.parameters())
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, noise in zip(params, fixed["weight_noise"]):
                p.add_(noise)
            output["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1),
                torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
                output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
            for p, value in zip(params, saved):
                p.copy_(value)
    return output


class GradRecorder(TrainerCallback):
    """Keeps the (all-reduced) gradients right before the optimizer step."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def install_fixed_batch(trainer, batch, scenario) -> list[float]:
    """Make `trainer` train on `batch` (via `fixed_generation`) with the behaviour policy of `scenario` (log-ratios
    of `batches.log_ratios`, or perturbed weights for "weights"), and record each micro-batch's local loss into the
    returned list."""
    fixed = {"batch": batch, "old_per_token_logps": None, "weight_noise": None}
    if scenario == "weights":
        g = torch.Generator().manual_seed(5)
        fixed["weight_noise"] = [
            OTB_WEIGHT_NOISE * torch.randn(p.shape, generator=g) for p in trainer.model.parameters()
        ]
    else:
        with torch.no_grad():  # initial log-probs over the WHOLE global batch, identical on every rank
            logps, _, _ = _forward(trainer, trainer.model, batch)
        fixed["old_per_token_logps"] = (logps - batches.log_ratios(scenario)).detach()
    trainer._fixed = fixed

    local_losses: list[float] = []
    compute_loss = trainer._compute_loss

    def recording_compute_loss(self, model, inputs):
        loss = compute_loss(model, inputs)
        local_losses.append(loss.item())
        return loss

    trainer._compute_loss = MethodType(recording_compute_loss, trainer)
    return local_losses


def run_case(name, cli, tokenizer, batch):
    method, overrides, scenario = CASES[name]
    world = cli.world_size
    args = method_config(
        method,
        os.path.join(cli.out, "run", name.replace("/", "_")),
        per_device_train_batch_size=batches.NUM_ROWS // world,
        num_generations=batches.GROUP_SIZE,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=1,
        max_completion_length=batches.COMPLETION_LEN,
        optim="sgd",
        lr_scheduler_type="constant",
        learning_rate=LEARNING_RATE,
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1e9,
        **overrides,
    )
    trainer = get_method(method).trainer_class(
        tiny_model(tokenizer, seed=1),
        length_reward,
        args=args,
        train_dataset=tiny_dataset(16),
        processing_class=tokenizer,
    )
    assert trainer.accelerator.num_processes == world, trainer.accelerator.num_processes
    local_losses = install_fixed_batch(trainer, batch, scenario_of(args, scenario))
    recorder = GradRecorder()
    trainer.add_callback(recorder)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    gc.collect()
    gc.freeze()  # the gc.collect() that accelerate runs at the end of train() then skips the long-lived heap
    set_seed(0)
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert recorder.grads is not None and len(local_losses) == 1
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    moved = max((params[n] - initial[n]).abs().max().item() for n in params)
    return (
        {"logged": logged, "local_loss": local_losses[0], "max_update": moved},
        {"grads": recorder.grads, "params": params, "initial": initial},
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    cli = parser.parse_args()
    assert_registered(VARIANTS, "VARIANTS")
    trl.GRPOTrainer._generate_and_score_completions = fixed_generation  # the parent of our base's override
    tokenizer = tiny_tokenizer()
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    results, tensors = {}, {}
    for name in cli.cases.split(","):
        results[name], tensors[name] = run_case(name, cli, tokenizer, batch)
    rank = int(os.environ.get("RANK", "0"))
    torch.save(tensors, os.path.join(cli.out, f"rank{rank}_tensors.pt"))
    write_result(cli.out, {"world_size": cli.world_size, "cases": results})


if __name__ == "__main__":
    main()
