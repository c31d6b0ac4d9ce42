"""Datasets for trl-groupopt: ecosystem adapters and the offline synthetic task.

Three things live here (SPEC section 1, ``data.py``; section 6, "Testing without the Hub"):

1. Adapters from the usual math datasets to TRL's conversational prompt-only format
   ``{"prompt": [{"role": "user", "content": ...}], "solution": "\\boxed{...}"}``, usable with
   ``Dataset.map``: :func:`gsm8k_to_conversational` (GSM8K, answer after ``####``) and
   :func:`math_to_conversational` (MATH, last ``\\boxed{}`` of the solution).
2. The offline synthetic reasoning task used by the demo, the tests and the benchmarks: seeded
   multi-step integer arithmetic ("Compute 12+7-30"), :func:`make_arithmetic_dataset`, with the
   chain-of-thought SFT target :func:`arithmetic_chain_of_thought`, and a tokenizer built in code,
   :func:`build_tokenizer` (no download).
3. The embedded tiny pretrained policy shipped in ``trl_groupopt/assets/tiny_policy`` (built by
   ``scripts/build_tiny_policy.py``): :data:`EMBEDDED_POLICY_PATH`, :func:`load_embedded_policy`,
   and :func:`greedy_accuracy` to measure a policy on the held-out split.

Nothing here touches the network: the tokenizer is made in code, the data is made in code, and
the policy loads from the package directory with ``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BOXED_SYSTEM_PROMPT",
    "CHAT_TEMPLATE",
    "EMBEDDED_POLICY_PATH",
    "arithmetic_chain_of_thought",
    "arithmetic_problems",
    "build_tokenizer",
    "evaluate_expression",
    "expression_of_prompt",
    "extract_last_boxed",
    "greedy_accuracy",
    "gsm8k_to_conversational",
    "load_embedded_policy",
    "make_arithmetic_dataset",
    "math_to_conversational",
    "save_tokenizer",
]

# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Role markers of the chat template: single tokens, registered as additional special tokens so
# `decode(..., skip_special_tokens=True)` drops them like any chat model's markers.
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# Multi-character words that get one token each (the answer wrapper and the task's verb).
WORD_TOKENS = ["\\boxed{", "Compute"]
CHAR_TOKENS = (
    list("0123456789")
    + list("+-*/=.,:?()[]{}^$\\")
    + [" ", "\n"]
    + list("abcdefghijklmnopqrstuvwxyz")
)

# Jinja chat template: bos, one line per system/user turn, assistant turn closed by eos; with
# add_generation_prompt the rendered prompt ends at the assistant marker, so it is an exact token
# prefix of the full conversation (asserted in tests/test_offline_kit.py).
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


def _vocabulary() -> dict[str, int]:
    tokens = SPECIAL_TOKENS + ROLE_TOKENS + WORD_TOKENS + CHAR_TOKENS
    if len(set(tokens)) != len(tokens):  # a duplicate would silently alias two ids
        raise ValueError("duplicate token in the tiny vocabulary")
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer():
    """Build the character-level tokenizer of the synthetic task, in code (no download).

    A ``tokenizers`` ``WordLevel`` model over ~70 symbols (specials ``<pad> <bos> <eos> <unk>``,
    role markers, ``\\boxed{`` and ``Compute`` as single tokens, digits, operators, punctuation,
    space, newline and ``a``-``z``). A ``Split`` pre-tokenizer isolates the multi-character words
    or any single character (``[\\s\\S]``: oniguruma has no ``(?s:.)``), so every character outside
    the vocabulary (upper case, unicode) becomes one ``<unk>`` and GSM8K/MATH text still
    tokenizes. ``decoders.Fuse()`` joins tokens back without spaces, so ``decode(encode(s)) == s``
    for text inside the vocabulary. Left padding (generation), no post-processor: the chat
    template writes ``<bos>`` itself, so ``add_special_tokens`` never doubles it.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with bos/eos/pad/unk set and :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = _vocabulary()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words = SPECIAL_TOKENS + ROLE_TOKENS + WORD_TOKENS
    pattern = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    # Specials and role markers are matched before pre-tokenization and marked special.
    tok.add_special_tokens(SPECIAL_TOKENS + ROLE_TOKENS)
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


def save_tokenizer(tokenizer, path: str | os.PathLike) -> None:
    """Save ``tokenizer`` so it loads on transformers 5.x and on 4.57.

    transformers 5 writes ``tokenizer_class: TokenizersBackend``, a ``backend`` key and
    ``extra_special_tokens`` as a list, none of which 4.57 reads; 4.57 would also return
    ``token_type_ids``, which GRPOTrainer passes on to ``generate()``. So the saved
    ``tokenizer_config.json`` is rewritten: ``tokenizer_class: PreTrainedTokenizerFast``, the role
    markers as ``additional_special_tokens``, no ``backend`` key, ``model_input_names`` =
    ``["input_ids", "attention_mask"]`` (recipe measured in shared/notes/offline-demo.md).
    """
    path = Path(path)
    tokenizer.save_pretrained(str(path))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, dict):  # the 4.x meaning of the key (named specials): keep as is
        cfg["extra_special_tokens"] = extra
    cfg["additional_special_tokens"] = list(ROLE_TOKENS)
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    cfg["padding_side"] = "left"
    cfg["clean_up_tokenization_spaces"] = False
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        cfg[name] = getattr(tokenizer, name)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    # Both versions read chat_template.jinja; keep the template inline too for older readers.
    if not (path / "chat_template.jinja").exists():
        (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    # 4.x also reads special_tokens_map.json; keep it consistent with the config.
    (path / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "bos_token": tokenizer.bos_token,
                "eos_token": tokenizer.eos_token,
                "pad_token": tokenizer.pad_token,
                "unk_token": tokenizer.unk_token,
                "additional_special_tokens": list(ROLE_TOKENS),
            },
            indent=2,
        )
        + "\n"
    )


# ---------------------------------------------------------------------------------------------
# The synthetic arithmetic task
# ---------------------------------------------------------------------------------------------

OPERAND_RANGE = (1, 50)  # inclusive
NUM_OPERATIONS = (2, 3)  # operations per problem, chosen uniformly
OPERATORS = ("+", "-")
TEST_FRACTION_PER_MILLE = 100  # 10% of the problem space is reserved for the test split
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
    """SFT target for one problem: one step per operation, then the answer.

    ``"12+7-30"`` gives ``"12+7=19. 19-30=-11. \\boxed{-11}"``; with ``boxed=False`` the answer
    is the bare number (``"12+7=19. 19-30=-11. -11"``), which the accuracy reward scores 0: the
    format headroom RL can learn (shared/notes/offline-demo.md).
    """
    terms = _parse_expression(expression)
    value = terms[0][1] if terms[0][0] == "+" else -terms[0][1]
    steps = []
    for sign, num in terms[1:]:
        new = value + num if sign == "+" else value - num
        steps.append(f"{value}{sign}{num}={new}.")
        value = new
    answer = f"\\boxed{{{value}}}" if boxed else str(value)
    return " ".join(steps + [answer])


def arithmetic_problems(num_examples: int, seed: int = 0, split: str = "train") -> list[str]:
    """``num_examples`` distinct expressions (e.g. ``"12+7-30"``) of the given split.

    Operands uniform in 1..50, 2 or 3 operations, each ``+`` or ``-``. A problem belongs to the
    test split iff a SHA-256 hash of its text falls in the reserved 10%, so the splits are
    disjoint for every seed; the list is a deterministic function of (num_examples, seed, split).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    rng = random.Random(f"trl_groupopt-arithmetic-{seed}-{split}")
    want_test = split == "test"
    lo, hi = OPERAND_RANGE
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < num_examples:
        n_ops = rng.randint(*NUM_OPERATIONS)
        expr = str(rng.randint(lo, hi))
        for _ in range(n_ops):
            expr += rng.choice(OPERATORS) + str(rng.randint(lo, hi))
        if expr in seen or _is_test_problem(expr) != want_test:
            continue
        seen.add(expr)
        out.append(expr)
    return out


def make_arithmetic_dataset(num_examples: int, seed: int = 0, split: str = "train"):
    """The offline reasoning task as a conversational prompt-only ``datasets.Dataset``.

    Columns:
        ``prompt``: ``[{"role": "user", "content": "Compute 12+7-30"}]``
        ``solution``: ``"\\boxed{-11}"`` (parsed by :func:`trl_groupopt.rewards.accuracy_reward`
        and by ``trl.rewards.accuracy_reward``)
        ``answer``: ``-11`` (int)

    Deterministic given (num_examples, seed, split); train and test are disjoint (see
    :func:`arithmetic_problems`). Completions need up to ~46 tokens with the shipped tokenizer
    (3 steps and a boxed 4-character answer, plus eos): use ``max_completion_length=48``.
    """
    from datasets import Dataset

    exprs = arithmetic_problems(num_examples, seed=seed, split=split)
    answers = [evaluate_expression(e) for e in exprs]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Compute {e}"}] for e in exprs],
            "solution": [f"\\boxed{{{a}}}" for a in answers],
            "answer": answers,
        }
    )


def expression_of_prompt(prompt: str | Sequence[dict[str, Any]]) -> str:
    """Recover ``"12+7-30"`` from a task prompt (string or conversational)."""
    if not isinstance(prompt, str):
        prompt = prompt[-1]["content"]
    if not prompt.startswith("Compute "):
        raise ValueError(f"not an arithmetic task prompt: {prompt!r}")
    return prompt[len("Compute ") :].strip()


# ---------------------------------------------------------------------------------------------
# Adapters for GSM8K and MATH style datasets
# ---------------------------------------------------------------------------------------------

BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def _messages(question: str, system_prompt: str | None) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
    msgs.append({"role": "user", "content": question})
    return msgs


def gsm8k_to_conversational(row: dict[str, Any], system_prompt: str | None = None) -> dict[str, Any]:
    """Map a GSM8K row (``question``, ``answer`` ending in ``#### 42``) to a TRL prompt row.

    Returns ``{"prompt": [...], "solution": "\\boxed{42}"}``. Thousands separators and a ``$``
    sign are removed from the final answer (``#### 1,000`` -> ``\\boxed{1000}``). If the answer has
    no ``####`` the solution is ``""``, which the accuracy reward treats as an unparseable gold
    (reward ``None``, the example is skipped). Use with ``dataset.map(gsm8k_to_conversational)``
    or ``dataset.map(gsm8k_to_conversational, fn_kwargs={"system_prompt": BOXED_SYSTEM_PROMPT})``.
    """
    answer = str(row["answer"])
    final = answer.split("####")[-1].strip() if "####" in answer else ""
    final = final.replace(",", "").replace("$", "").strip()
    return {
        "prompt": _messages(str(row["question"]), system_prompt),
        "solution": f"\\boxed{{{final}}}" if final else "",
    }


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched.

    ``\\boxed 5`` (no braces) gives ``"5"``; returns ``None`` when there is none or it is unclosed.
    """
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\s*(\{|\s+(\S+))", text)]
    if not starts:
        return None
    m = starts[-1]
    if m.group(1) != "{":  # "\boxed 5": a bare token
        return m.group(2).rstrip("$.")
    depth, i = 1, m.end()
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[m.end() : i]
        i += 1
    return None


def math_to_conversational(row: dict[str, Any], system_prompt: str | None = None) -> dict[str, Any]:
    """Map a MATH row (``problem``, ``solution`` with a final ``\\boxed{}``) to a TRL prompt row.

    Returns ``{"prompt": [...], "solution": "\\boxed{<last boxed content>}"}`` with nested braces
    kept (``\\boxed{\\frac{1}{2}}``). A solution with no boxed answer gives ``""`` (reward
    ``None`` downstream: skipped, never scored as wrong).
    """
    content = extract_last_boxed(str(row["solution"]))
    return {
        "prompt": _messages(str(row["problem"]), system_prompt),
        "solution": f"\\boxed{{{content}}}" if content else "",
    }


# ---------------------------------------------------------------------------------------------
# The embedded tiny policy
# ---------------------------------------------------------------------------------------------

EMBEDDED_POLICY_PATH: str = str(Path(__file__).resolve().parent / "assets" / "tiny_policy")


def load_embedded_policy(path: str | os.PathLike | None = None):
    """Load the shipped tiny policy: ``(LlamaForCausalLM, tokenizer)``, offline, fp32, eval mode.

    A 1.06 M-parameter Llama SFT-trained on the arithmetic task (see the asset's README.md for
    how it was built and its measured greedy accuracy). Loads from the package directory with
    ``local_files_only=True``: no Hub access.
    """
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
    """Greedy-decoding accuracy of ``model`` on a prompt/solution dataset.

    Renders each ``prompt`` with the chat template (generation prompt), decodes greedily up to
    ``max_new_tokens`` (left padding, batches of ``batch_size``), and scores the decoded text with
    :func:`trl_groupopt.rewards.accuracy_reward` (math-verify, boxed answer required) and
    :func:`trl_groupopt.rewards.format_reward`. With ``do_sample=True`` it samples at
    ``temperature`` instead (pure sampling: top-k/top-p off), i.e. the accuracy GRPO's rollouts
    see; seed torch first for a reproducible number.

    Returns:
        ``{"accuracy", "format_rate", "num_examples", "num_scored"}`` (+ ``"completions"``);
        accuracy averages over examples whose gold parses.
    """
    import torch

    from .rewards import accuracy_reward, format_reward

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen_kwargs = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if do_sample else {"do_sample": False}
    )
    completions: list[str] = []
    prompts = list(dataset["prompt"])
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            out = model.generate(
                **enc,
                **gen_kwargs,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
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
