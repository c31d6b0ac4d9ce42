"""The embedded tiny policies in ``trl_groupopt/assets/`` (built by ``scripts/build_tiny_policy.py``; see
docs/embedded-policy.md): one for the default task, one for the long-chain variant."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from .task import LONG_CHAIN, LONG_CHAIN_MAX_COMPLETION_LENGTH

_ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_POLICY_PATH: str = str(_ASSETS / "tiny_policy")
EMBEDDED_LONG_POLICY_PATH: str = str(_ASSETS / "tiny_policy_long")


class Variant(NamedTuple):
    """A variant of the task and the embedded policy trained on it."""

    policy: str  # the shipped policy folder
    task: dict[str, tuple[int, int]]  # keyword arguments of make_arithmetic_dataset / arithmetic_problems
    max_new_tokens: int  # a decoding length that truncates no correct completion


VARIANTS: dict[str, Variant] = {
    "default": Variant(EMBEDDED_POLICY_PATH, {}, 48),
    "long": Variant(EMBEDDED_LONG_POLICY_PATH, LONG_CHAIN, LONG_CHAIN_MAX_COMPLETION_LENGTH),
}


def load_embedded_policy(path: str | os.PathLike | None = None):
    """Load a shipped tiny policy (default: :data:`EMBEDDED_POLICY_PATH`): ``(LlamaForCausalLM, tokenizer)``, offline,
    fp32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(path or EMBEDDED_POLICY_PATH)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    model.eval()
    return model, tokenizer


def greedy_accuracy(
    model,
    tokenizer,
    dataset,
    *,
    max_new_tokens: int = 48,
    batch_size: int = 200,
    return_completions: bool = False,
    do_sample: bool = False,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Greedy-decoding accuracy of ``model`` on a prompt/solution dataset (``do_sample=True``: pure sampling at
    ``temperature``, what GRPO's rollouts see), scored by ``trl_groupopt.rewards``: ``{"accuracy", "format_rate",
    "num_examples", "num_scored"}`` (+ ``"completions"``); accuracy averages over examples whose gold parses."""
    import torch

    from ..rewards import accuracy_reward, format_reward

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen_kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if do_sample else {}
    gen_kwargs.update(do_sample=do_sample, max_new_tokens=max_new_tokens)
    gen_kwargs.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    completions: list[str] = []
    prompts = list(dataset["prompt"])
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            out = model.generate(**enc, **gen_kwargs)
            completions += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    if was_training:
        model.train()
    acc = accuracy_reward(completions, list(dataset["solution"]))
    fmt = format_reward(completions)
    scored = [a for a in acc if a is not None]
    result: dict[str, Any] = {
        "accuracy": sum(scored) / len(scored) if scored else float("nan"),
        "format_rate": sum(fmt) / len(fmt) if fmt else float("nan"),
        "num_examples": len(completions),
        "num_scored": len(scored),
    }
    if return_completions:
        result["completions"] = completions
    return result
