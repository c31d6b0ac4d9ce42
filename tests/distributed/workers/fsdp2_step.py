"""Worker: one optimizer step of the base trainer and every method under FSDP2 (2 processes) or plainly (1 process).

The machinery is `one_step.py`'s (fixed generation batch, fixed off-policy log-ratios, SGD, gradient recorder); this
worker only adds FSDP2 and reads sharded tensors back in full.

FSDP2 on CPU. accelerate 1.15 refuses FSDP on CPU silently: `AcceleratorState` only switches to
`DistributedType.FSDP` from a GPU-like multi-process type (`state.py`, the `MULTI_GPU, MULTI_MLU, ...` branch), so
`use_cpu=True` with `fsdp="full_shard"` trains with plain DDP and the model is never sharded. `force_fsdp_on_cpu`
lets accelerate's own FSDP2 path run on gloo: when the plugin is there and the type is MULTI_CPU it sets the type
to FSDP (on `PartialState`'s shared state too, which every `AcceleratorState()` copies). From there everything is
accelerate's FSDP2 plugin (`fsdp2_prepare_model`: `fully_shard` per `Qwen2DecoderLayer` and on the root, DTensor
parameters sharded on dim 0), transformers' and TRL's FSDP code paths included. The worker asserts the sharding.

Writes `rank{R}.json` ({"world_size", "fsdp", "cases": {name: {...}}}) and `rank{R}_tensors.pt`
({name: {"grads", "params", "initial"}}, full tensors).
"""

import argparse
import gc
import os
import sys
from types import MethodType

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import one_step  # noqa: E402
import trl  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # noqa: E402
from transformers import set_seed  # noqa: E402

from tests.distributed import batches  # noqa: E402
from tests.distributed.harness import write_result  # noqa: E402
from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402
from trl_groupopt import (
    OTBTrainer,  # noqa: E402
    get_method,  # noqa: E402
)

FSDP2_ARGS = dict(
    fsdp="full_shard",
    fsdp_config={
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"],
        "reshard_after_forward": True,
    },
)
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
# The base trainer and every method, in the sharding-invariant configurations of test_sharding_invariance.py.
LORA_CASES = {"lora/otb": "otb"}  # LoRA (PEFT) + FSDP2: OTB, whose energy capture wraps the PEFT base model


def force_fsdp_on_cpu() -> None:
    """Let accelerate's FSDP2 plugin run on CPU processes (see the module docstring)."""
    import accelerate.state as state
    from accelerate.utils import DistributedType

    original_init = state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    state.AcceleratorState.__init__ = init


def full(tensor):
    """A full tensor from an FSDP2 shard (a collective: every rank calls it in the same order)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def fixed_generation(self, inputs):
    """`one_step.fixed_generation`, with OTB's weight noise laid out as the (sharded) parameters it perturbs."""
    fixed = self._fixed
    if fixed["weight_noise"] is not None and not fixed.get("noise_placed"):
        fixed["weight_noise"] = [
            distribute_tensor(noise, p.device_mesh, p.placements) if isinstance(p, DTensor) else noise
            for p, noise in zip(self.model.parameters(), fixed["weight_noise"])
        ]
        fixed["noise_placed"] = True
    # FSDP2 keeps the root module's parameters unsharded after a forward: the perturbation (and its undoing) of the
    # sharded parameters reaches the next forward only through a fresh all-gather.
    reshard(self.model)
    output = one_step.fixed_generation(self, inputs)
    reshard(self.model)
    return output


def reshard(model) -> None:
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def run_case(name, cli, tokenizer, batch):
    method = LORA_CASES.get(name, name)
    method, overrides, scenario = one_step.CASES[method]
    trainer_cls = get_method(method).trainer_class
    world = cli.world_size
    fsdp = FSDP2_ARGS if world > 1 else {}
    args = get_method(method).make_config(
        **cpu_config_kwargs(
            os.path.join(cli.out, "run", name.replace("/", "_")),
            per_device_train_batch_size=batches.NUM_ROWS // world,
            num_generations=batches.GROUP_SIZE,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            max_steps=1,
            max_completion_length=batches.COMPLETION_LEN,
            optim="sgd",
            lr_scheduler_type="constant",
            learning_rate=one_step.LEARNING_RATE,
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1e9,
            **fsdp,
            **overrides,
        )
    )
    peft_config = None
    if name in LORA_CASES:
        from peft import LoraConfig

        peft_config = LoraConfig(**LORA)
    trainer = trainer_cls(
        tiny_model(tokenizer, seed=1),
        length_reward,
        args=args,
        train_dataset=tiny_dataset(16),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    assert trainer.accelerator.num_processes == world, trainer.accelerator.num_processes
    assert trainer.is_fsdp_enabled == (world > 1)
    if name in LORA_CASES:  # make the adapter non-trivial, so the base weights' perturbation reaches the gradient
        torch.manual_seed(7)
        with torch.no_grad():
            for n, p in trainer.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.1)
    local_losses = one_step.install_fixed_batch(trainer, batch, one_step.scenario_of(trainer.args, scenario))
    otb = {}
    if isinstance(trainer, OTBTrainer):  # keep the advantages (they carry the energy) and the behaviour energy
        compute_advantages = trainer.compute_advantages

        def recording_compute_advantages(self, inputs, per_token_logps, mask):
            advantages = compute_advantages(inputs, per_token_logps, mask)
            order = torch.sort(inputs["group_ids"], stable=True).indices  # undo the shuffle of whole groups
            otb.update(group_ids=inputs["group_ids"][order], advantages=advantages.detach()[order])
            if "old_per_token_energy" in inputs:
                otb["energy"] = inputs["old_per_token_energy"][order]
            return advantages

        trainer.compute_advantages = MethodType(recording_compute_advantages, trainer)
    recorder = one_step.GradRecorder()
    trainer.add_callback(recorder)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    gc.collect()
    gc.freeze()
    set_seed(0)
    trainer.train()

    named = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    shards = [p for _, p in named if isinstance(p, DTensor)]
    sharding = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "model_class": type(trainer.model).__name__,
        "dtensor_params": len(shards),
        "trainable_params": len(named),
        "sharded_dim0": all(p.placements == (Shard(0),) for p in shards),
        "local_numel": sum(p.to_local().numel() for p in shards),
        "full_numel": sum(p.numel() for p in shards),
    }
    params = {n: full(p.detach()).clone() for n, p in named}
    grads = {n: full(g) for n, g in recorder.grads.items()}
    assert len(local_losses) == 1 and grads
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    return (
        {"logged": logged, "local_loss": local_losses[0], "sharding": sharding},
        {"grads": grads, "params": params, "initial": initial, "otb": otb},
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--cases", required=True, help="comma-separated one_step case names and LORA_CASES keys")
    cli = parser.parse_args()
    if cli.world_size > 1:
        force_fsdp_on_cpu()
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
