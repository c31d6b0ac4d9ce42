r"""Reward functions with TRL's signature ``f(completions, **kwargs) -> list[float | None]``.

``completions`` may be conversational (each a list of ``{"role", "content"}`` dicts, as
GRPOTrainer passes them for conversational datasets) or plain strings (standard datasets); both
are accepted. Dataset columns arrive as keyword arguments (``solution=...``), and the trainer
also passes ``prompts``, ``completion_ids``, ``trainer_state``, ``log_extra`` and ``log_metric``,
which are accepted and, except ``log_extra``, ignored.

- :func:`accuracy_reward`: math-verify equivalence of the completion's boxed answer with the gold
  ``solution``, with the same parsing as ``trl.rewards.accuracy_reward`` (TRL 1.16): the gold is
  parsed with math-verify's default extraction (``\boxed{N}`` or a plain final answer such as
  ``"42"``); an unparseable gold gives ``None`` (the trainer skips the example); the completion is
  parsed with ``LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)``,
  so a bare number without ``\boxed{}`` (or ``$...$``/"final answer is") scores 0: format matters.
- :func:`format_reward`: 1.0 iff the completion has exactly one well-formed ``\boxed{...}`` and
  it ends the completion (rule in its docstring).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["accuracy_reward", "completion_text", "format_reward"]

BOXED = "\\boxed{"
# Characters allowed after the closing brace of the final \boxed{...}: whitespace, a full stop,
# and math delimiters ("$\boxed{4}$.", "\[ \boxed{4} \]").
_TRAILING_OK = set(" \t\r\n.$") | set("\\[]()")


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """Text of one completion: a string as is; for messages, the content of the last message.

    A single assistant message (what GRPOTrainer passes) gives exactly TRL's
    ``completion[0]["content"]``; multimodal content parts (``[{"type": "text", "text": ...}]``)
    are joined.
    """
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    content = completion[-1].get("content", "")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def accuracy_reward(
    completions: Sequence[str | Sequence[dict[str, Any]]],
    solution: Sequence[str],
    log_extra: Callable[[str, list], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 if the completion's boxed answer is math-equivalent to the gold ``solution``, else 0.0.

    Same parsing and verification as ``trl.rewards.accuracy_reward`` (TRL 1.16):
    ``gold = parse(solution)`` with math-verify's defaults (``\boxed{-11}``, ``-11``,
    ``\frac{1}{2}`` all parse); if nothing parses the reward is ``None`` (skipped by the trainer,
    never counted as wrong). Otherwise the completion is parsed with
    ``LatexExtractionConfig(NormalizationConfig(units=True), boxed_match_priority=0,
    try_extract_without_anchor=False)`` in ``first_match`` mode and compared with ``verify``.
    The answer must be boxed (or in an anchored LaTeX form): ``"... -11"`` scores 0.

    Args:
        completions: conversational completions (lists of message dicts) or plain strings.
        solution: gold answers, one per completion (the dataset's ``solution`` column).
        log_extra: provided by GRPOTrainer; logs the gold/parsed answers to the completions table.
    """
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    if len(completions) != len(solution):
        raise ValueError(f"got {len(completions)} completions but {len(solution)} solutions")
    # math-verify times out with signal.alarm, which only works in the main thread.
    is_main_thread = threading.current_thread() is threading.main_thread()
    parsing_timeout = 10 if is_main_thread else None
    verify_timeout = 5 if is_main_thread else None
    if not is_main_thread:
        logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
        logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    answer_config = [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True),
            boxed_match_priority=0,  # boxed first
            try_extract_without_anchor=False,  # a bare number is not an answer
        )
    ]

    gold_cache: dict[str, list] = {}  # each solution repeats num_generations times
    rewards: list[float | None] = []
    gold_strs: list[str] = []
    answer_strs: list[str] = []
    for completion, sol in zip(completions, solution):
        sol = "" if sol is None else str(sol)
        if sol not in gold_cache:
            gold_cache[sol] = parse(sol, parsing_timeout=parsing_timeout)
        gold = gold_cache[sol]
        if len(gold) == 0:
            rewards.append(None)
            gold_strs.append("[unparseable]")
            answer_strs.append("[skipped]")
            continue
        answer = parse(
            completion_text(completion),
            extraction_config=answer_config,
            extraction_mode="first_match",
            parsing_timeout=parsing_timeout,
        )
        rewards.append(float(verify(gold, answer, timeout_seconds=verify_timeout)))
        gold_strs.append(str(gold))
        answer_strs.append(str(answer) if answer else "[unparseable]")

    if log_extra is not None:
        log_extra("solution", [str(s) for s in solution])
        log_extra("gold_parsed", gold_strs)
        log_extra("answer_parsed", answer_strs)
    return rewards


def _boxed_span(text: str, start: int) -> int | None:
    """Index just past the brace closing the ``\\boxed{`` at ``start``; None if unbalanced."""
    depth, i = 1, start + len(BOXED)
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def format_reward(completions: Sequence[str | Sequence[dict[str, Any]]], **kwargs: Any) -> list[float]:
    r"""1.0 iff the completion ends with its only, well-formed ``\boxed{...}``; else 0.0.

    Rule, checked on the completion text:
    1. ``\boxed{`` occurs exactly once (two boxed answers are ambiguous);
    2. its braces balance and the content is non-blank (``\boxed{}`` is no answer);
    3. after the closing brace come only whitespace, ``.``, ``$``, ``\``, ``[``, ``]``, ``(``,
       ``)`` (e.g. ``$\boxed{4}$.`` or ``\[\boxed{4}\]``), so the answer is the end of the
       completion, not an intermediate remark followed by more reasoning.

    Correctness is not checked: this rewards the answer format only, and pairs with
    :func:`accuracy_reward`.
    """
    rewards: list[float] = []
    for completion in completions:
        text = completion_text(completion)
        ok = text.count(BOXED) == 1
        if ok:
            start = text.index(BOXED)
            end = _boxed_span(text, start)
            ok = (
                end is not None
                and text[start + len(BOXED) : end - 1].strip() != ""
                and all(ch in _TRAILING_OK for ch in text[end:])
            )
        rewards.append(1.0 if ok else 0.0)
    return rewards
