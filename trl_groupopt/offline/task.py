"""The offline synthetic reasoning task: seeded multi-step integer arithmetic ("Compute 12+7-30"); see
docs/embedded-policy.md."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

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
    """The task as a conversational prompt-only ``datasets.Dataset`` (columns ``prompt``, ``solution``:
    ``"\\boxed{-11}"``, ``answer``: ``-11``); ``variant``: ``operations``, ``operands`` (:func:`arithmetic_problems`).
    Completions of the default variant need up to ~46 tokens (use ``max_completion_length=48``); the long-chain
    variant needs :data:`LONG_CHAIN_MAX_COMPLETION_LENGTH`."""
    from datasets import Dataset

    exprs = arithmetic_problems(num_examples, seed=seed, split=split, **variant)
    answers = [evaluate_expression(e) for e in exprs]
    prompts = [[{"role": "user", "content": f"Compute {e}"}] for e in exprs]
    return Dataset.from_dict({"prompt": prompts, "solution": [f"\\boxed{{{a}}}" for a in answers], "answer": answers})


def expression_of_prompt(prompt: str | Sequence[dict[str, Any]]) -> str:
    """Recover ``"12+7-30"`` from a task prompt (string or conversational)."""
    if not isinstance(prompt, str):
        prompt = prompt[-1]["content"]
    if not prompt.startswith("Compute "):
        raise ValueError(f"not an arithmetic task prompt: {prompt!r}")
    return prompt[len("Compute ") :].strip()
