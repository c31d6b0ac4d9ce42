"""Fixtures shared by the trainer tests: tiny models built from config, the in-code tokenizer, small data, and the
one place that builds any registered method's config and trainer (`method_config`, `method_trainer`).

Nothing here touches the Hub. Building a trainer costs seconds on CPU, so tests group their checks per trainer.
Parametrised tests read `trl_groupopt.METHODS`; a test that needs per-method data keeps a table keyed by registry
names holding only overrides or exceptions (checked by `assert_registered`), so a new method runs every test with its
defaults and needs no test-table edit.
"""

from __future__ import annotations

import copy

import torch
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM

from trl_groupopt import METHODS, get_method
from trl_groupopt.data.offline import build_tokenizer, make_arithmetic_dataset
from trl_groupopt.methods.registry import discover


def tiny_tokenizer():
    """The library's in-code tokenizer (no files, no Hub)."""
    return build_tokenizer()


def tiny_model(tokenizer=None, seed: int = 0, hidden_size: int = 32, num_layers: int = 2) -> Qwen2ForCausalLM:
    """A random Qwen2 with hidden 32 and 2 layers, fp32, sized to the tokenizer's vocabulary."""
    tokenizer = tokenizer or tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_dataset(num_examples: int = 16, seed: int = 0) -> Dataset:
    return make_arithmetic_dataset(num_examples, seed=seed)


def length_reward(completions, **kwargs) -> list[float]:
    """A cheap dense reward for tests: longer completions score higher (any reward works for mechanics)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(t)) / 10.0 for t in texts]


def cpu_config_kwargs(output_dir, **overrides) -> dict:
    """GRPOConfig kwargs for fast, deterministic CPU runs (fp32: no bf16 on CPU; no gradient checkpointing)."""
    kwargs = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-3,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
    )
    kwargs.update(overrides)
    return kwargs


def method_config(name: str, output_dir, **overrides):
    """The config of the registered method `name` with the CPU test defaults of `cpu_config_kwargs`; `overrides` win
    over them."""
    return get_method(name).make_config(**cpu_config_kwargs(output_dir, **overrides))


def method_trainer(name: str, output_dir, model, tokenizer, reward_funcs=length_reward, num_examples: int = 32,
                   **overrides):  # fmt: skip
    """The registered method's trainer on `model` (used as is: clone it first to reuse it) and the tiny dataset."""
    args = method_config(name, output_dir, **overrides)
    return get_method(name).trainer_class(model, reward_funcs, args=args, train_dataset=tiny_dataset(num_examples),
                                          processing_class=tokenizer)  # fmt: skip


#: The methods the library ships (the folders `trl_groupopt/methods/<name>/`), as the registry discovers them.
BUILT_IN_METHODS = frozenset(spec.name for spec in discover())


def assert_registered(table, what: str = "table") -> None:
    """A per-method table (overrides or expected exceptions) names only registered methods: no stale entries.

    Tests are parametrised over `METHODS` and fall back to a method's defaults where its name is not in the table,
    so a new method runs through every test without editing any table."""
    unknown = sorted(set(table) - set(METHODS))
    assert not unknown, f"{what}: {unknown} are not registered methods"


def clone_model(model):
    return copy.deepcopy(model)


def random_batch(
    tokenizer,
    batch_size: int = 4,
    prompt_len: int = 5,
    completion_len: int = 7,
    seed: int = 0,
    group_size: int | None = None,
    off_policy_scale: float = 0.3,
    with_ref: bool = True,
) -> dict:
    """A batch in the shape `_generate_and_score_completions` returns, with ragged completions (padding and an
    all-empty row) and random behaviour/reference log-probs, for calling `_compute_loss` directly."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    low = 4  # skip special tokens
    prompt_ids = torch.randint(low, vocab, (batch_size, prompt_len), generator=g)
    prompt_mask = torch.ones(batch_size, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    prompt_ids[0, :2] = tokenizer.pad_token_id
    completion_ids = torch.randint(low, vocab, (batch_size, completion_len), generator=g)
    lengths = torch.randint(1, completion_len + 1, (batch_size,), generator=g)
    lengths[-1] = completion_len
    completion_mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    advantages = torch.randn(batch_size, generator=g)
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
        # log-probs perturbation: stands in for the behaviour / reference policy
        "old_logp_noise": off_policy_scale * torch.randn(batch_size, completion_len, generator=g),
        "ref_logp_noise": 0.2 * torch.randn(batch_size, completion_len, generator=g) if with_ref else None,
    }
    if group_size is not None:
        batch["group_ids"] = torch.arange(batch_size) // group_size
    return batch


def _forward(trainer, model, batch):
    """TRL's log-prob forward (the loss's, without energy capture), for a GRPOTrainer or any of ours."""
    from trl_groupopt.trainer.loss import forward_arguments

    arguments, keywords = forward_arguments(batch, aux_loss=trainer.aux_loss_enabled)
    return trainer._get_per_token_logps_and_entropies(model, *arguments, **keywords)


def float64_forward(trainer, model, batch):
    """(B, T) float64 log-probs and entropies of the completion tokens: stands in for a trainer's
    `_forward_logps_and_entropies` where TRL's fused LM head (float32) would limit a float64 reference test."""
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, P + T, V)
    logits = logits[:, prompt_ids.size(1) - 1 : -1].double()  # (B, T, V) the logits that predict the completion
    log_probs = logits.log_softmax(-1)  # (B, T, V)
    logps = log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropies = -(log_probs.exp() * log_probs).sum(-1)  # (B, T)
    return logps, entropies, None


def inputs_with_policies(trainer, batch):
    """Materialise behaviour/reference log-probs from the trainer's own model plus fixed noise."""
    with torch.no_grad():
        # the same forward for both trainers (TRL's `_get_per_token_logps_and_entropies`)
        logps, _, _ = _forward(trainer, trainer.model, batch)
    inputs = {k: v for k, v in batch.items() if not k.endswith("_noise")}
    inputs["old_per_token_logps"] = (logps + batch["old_logp_noise"]).detach()
    if batch["ref_logp_noise"] is not None:
        inputs["ref_per_token_logps"] = (logps + batch["ref_logp_noise"]).detach()
    return inputs


def compute_loss_and_grads(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, dict(trainer._metrics["train"])
