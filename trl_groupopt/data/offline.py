"""Everything needed to train and test with no Hub and no GPU (docs/embedded-policy.md): the synthetic reasoning task
(seeded multi-step integer arithmetic, "Compute 12+7-30"), its character-level tokenizer built in code, and the
embedded tiny policies in ``trl_groupopt/assets/`` (built by ``scripts/build_tiny_policy.py``): one for the default
task, one for the long-chain variant."""

from __future__ import annotations

import hashlib
import os
import random
import re
from pathlib import Path
from typing import Any, NamedTuple

from .rewards import accuracy_reward, format_reward

__all__ = [
    "EMBEDDED_LONG_POLICY_PATH",
    "EMBEDDED_POLICY_PATH",
    "LONG_CHAIN",
    "VARIANTS",
    "arithmetic_chain_of_thought",
    "arithmetic_problems",
    "build_tokenizer",
    "evaluate_expression",
    "greedy_accuracy",
    "load_embedded_policy",
    "make_arithmetic_dataset",
    "uses_embedded_policy",
]

OPERAND_RANGE = (1, 50)  # inclusive
NUM_OPERATIONS = (2, 3)  # operations per problem, chosen uniformly
OPERATORS = ("+", "-")
TEST_FRACTION_PER_MILLE = 100  # 10% of the problem space is reserved for the test split
#: The long-chain variant: ``make_arithmetic_dataset(n, **LONG_CHAIN)``. Smaller operands than the default keep each
#: step learnable by a 1 M-parameter policy, so accuracy depends on carrying the chain, not on 3-digit sums.
LONG_CHAIN: dict[str, tuple[int, int]] = {"operations": (8, 12), "operands": (1, 20)}
LONG_CHAIN_MAX_COMPLETION_LENGTH = 160  # correct completions: 71-143 tokens with eos over 500 sampled problems
_TERM = re.compile(r"([+-]?)(\d+)")


def _is_test_problem(expression: str) -> bool:
    """Deterministic split by a hash of the problem (stable across processes and machines)."""
    digest = hashlib.sha256(expression.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < TEST_FRACTION_PER_MILLE


def _parse_expression(expression: str) -> list[tuple[str, int]]:
    expression = expression.replace(" ", "")
    terms = [(sign or "+", int(num)) for sign, num in _TERM.findall(expression)]
    if not terms or "".join(f"{s}{n}" for s, n in terms).lstrip("+") != expression.lstrip("+"):
        raise ValueError(f"not a +/- integer expression: {expression!r}")
    return terms


def evaluate_expression(expression: str) -> int:
    """Value of a left-to-right ``+``/``-`` integer expression such as ``"12+7-30"``."""
    return sum(n if s == "+" else -n for s, n in _parse_expression(expression))


def arithmetic_chain_of_thought(expression: str, boxed: bool = True) -> str:
    """SFT target: ``"12+7-30"`` gives ``"12+7=19. 19-30=-11. \\boxed{-11}"``; with ``boxed=False`` the answer is
    the bare number, which the accuracy reward scores 0 (the format headroom RL can learn)."""
    terms = _parse_expression(expression)
    value = terms[0][1] if terms[0][0] == "+" else -terms[0][1]
    steps = []
    for sign, num in terms[1:]:
        new = value + num if sign == "+" else value - num
        steps.append(f"{value}{sign}{num}={new}.")
        value = new
    answer = f"\\boxed{{{value}}}" if boxed else str(value)
    return " ".join(steps + [answer])


def arithmetic_problems(
    num_examples: int,
    seed: int = 0,
    split: str = "train",
    *,
    operations: tuple[int, int] = NUM_OPERATIONS,
    operands: tuple[int, int] = OPERAND_RANGE,
) -> list[str]:
    """``num_examples`` distinct expressions (e.g. ``"12+7-30"``) of the split, a deterministic function of the
    arguments (the default variant's lists are those of every earlier version); the splits are disjoint (a hash)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    for name, (lo, hi) in (("operations", operations), ("operands", operands)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {(lo, hi)}")
    variant = "" if (operations, operands) == (NUM_OPERATIONS, OPERAND_RANGE) else f"{operations}-{operands}-"
    rng = random.Random(f"trl_groupopt-arithmetic-{variant}{seed}-{split}")
    want_test = split == "test"
    lo, hi = operands
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < num_examples:
        n_ops = rng.randint(*operations)
        expr = str(rng.randint(lo, hi))
        for _ in range(n_ops):
            expr += rng.choice(OPERATORS) + str(rng.randint(lo, hi))
        if expr in seen or _is_test_problem(expr) != want_test:
            continue
        seen.add(expr)
        out.append(expr)
    return out


def make_arithmetic_dataset(num_examples: int, seed: int = 0, split: str = "train", **variant: tuple[int, int]):
    """The task as a conversational ``datasets.Dataset`` (``prompt``, ``solution``: ``"\\boxed{-11}"``, ``answer``:
    ``-11``) of :func:`arithmetic_problems`; completions need <= 46 tokens (long chains: see LONG_CHAIN_*)."""
    from datasets import Dataset

    exprs = arithmetic_problems(num_examples, seed=seed, split=split, **variant)
    answers = [evaluate_expression(e) for e in exprs]
    prompts = [[{"role": "user", "content": f"Compute {e}"}] for e in exprs]
    return Dataset.from_dict({"prompt": prompts, "solution": [f"\\boxed{{{a}}}" for a in answers], "answer": answers})


# ------------------------------------------------------------------------------------------------ the tokenizer
CONTROL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Role markers: special tokens, so `decode(..., skip_special_tokens=True)` drops them like any chat model's.
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# Multi-character words that get one token each (the answer wrapper and the task's verb).
WORD_TOKENS = ["\\boxed{", "Compute"]
CHAR_TOKENS = list("0123456789") + list("+-*/=.,:?()[]{}^$\\") + [" ", "\n"] + list("abcdefghijklmnopqrstuvwxyz")

# With add_generation_prompt the prompt ends at the assistant marker: a token prefix of the whole conversation.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{ '<|system|>' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{%- else %}{{ raise_exception('Unsupported role: ' + message['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{%- endif %}"
)


def build_tokenizer():
    """The task's ``PreTrainedTokenizerFast``: a ``WordLevel`` model over ~70 symbols; ``decode(encode(s)) == s`` for
    text inside the vocabulary, any other character is one ``<unk>`` (capitals too, but in ``Compute``). The
    vocabulary is the shipped policies' (``scripts/build_tiny_policy.py``): a new symbol would need new embedding and
    output rows, i.e. a retrained policy, so the training command's data door warns instead, naming the characters a
    user's prompts hold that it cannot encode (`trl_groupopt.data.prompts`). No post-processor: the chat template
    writes ``<bos>`` itself, so ``add_special_tokens`` never doubles it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = CONTROL_TOKENS + ROLE_TOKENS + WORD_TOKENS
    vocab = {token: i for i, token in enumerate(words + CHAR_TOKENS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # `[\s\S]`: oniguruma has no `(?s:.)`
    pattern = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    # Specials and role markers are matched before pre-tokenization and marked special.
    tok.add_special_tokens(CONTROL_TOKENS + ROLE_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        truncation_side="left",
        chat_template=CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,  # would rewrite " ." and break exact decoding
        model_max_length=256,
    )


# ------------------------------------------------------------------------------------------------ the policies
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
    """A shipped tiny policy (default: :data:`EMBEDDED_POLICY_PATH`) and its tokenizer, offline, fp32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(path or EMBEDDED_POLICY_PATH)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)


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
    ``temperature``, what GRPO's rollouts see), scored by ``trl_groupopt.data.rewards``: ``{"accuracy", "format_rate",
    "num_examples", "num_scored"}`` (+ ``"completions"``); accuracy averages over examples whose gold parses."""
    import torch

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
            # a string prompt as the trainer sends it; messages through the chat template
            texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False,
                     add_generation_prompt=True) for p in chunk]  # fmt: skip
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            out = model.generate(**enc, **gen_kwargs)
            completions += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
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


def uses_embedded_policy(model_name_or_path: str | None) -> bool:
    """Whether the run trains the shipped tiny policy (no model named, or its path named)."""
    return model_name_or_path is None or os.path.realpath(model_name_or_path) == os.path.realpath(EMBEDDED_POLICY_PATH)
