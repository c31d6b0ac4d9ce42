"""Reward functions with TRL's signature ``f(completions, **kwargs) -> list[float | None]``, for conversational or
plain-string completions; dataset columns and TRL's extra keywords arrive as keyword arguments."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["accuracy_reward", "closing_brace", "completion_text", "extract_last_boxed", "format_reward"]

BOXED = "\\boxed{"
# Allowed after the final \boxed{...}: whitespace, a full stop, math delimiters ("$\boxed{4}$.", "\[ \boxed{4} \]").
_TRAILING_OK = set(" \t\r\n.$") | set("\\[]()")


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """Text of one completion: a string as is; for messages, the last one's content (text parts joined)."""
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    content = completion[-1].get("content", "")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def accuracy_reward(
    completions: Sequence[str | Sequence[dict[str, Any]]], solution: Sequence[str | None], **kwargs: Any
) -> list[float | None]:
    r"""``trl.rewards.accuracy_reward`` (math-verify; the answer must be boxed: ``"... -11"`` scores 0) for any
    completion shape (TRL's reads ``completion[0]["content"]`` only); a ``None`` solution gives reward ``None``."""
    from trl.rewards import accuracy_reward as trl_accuracy_reward

    if len(completions) != len(solution):
        raise ValueError(f"got {len(completions)} completions but {len(solution)} solutions")
    messages = [[{"role": "assistant", "content": completion_text(c)}] for c in completions]
    gold = ["" if s is None else str(s) for s in solution]
    return trl_accuracy_reward(messages, gold, **kwargs)  # TRL's log_extra among them


def closing_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` that closes a ``{`` opened just before ``text[start]``; None if unbalanced."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


_BOXED_START = re.compile(r"\\(?:boxed|fbox)\s*(\{|\s+(\S+))")


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``, or None."""
    starts = list(_BOXED_START.finditer(text))
    if not starts:
        return None
    m = starts[-1]
    if m.group(1) != "{":  # "\boxed 5": a bare token
        return m.group(2).rstrip("$.")
    end = closing_brace(text, m.end())
    return None if end is None else text[m.end() : end]


def _formatted(text: str) -> bool:
    if text.count(BOXED) != 1:
        return False
    start = text.index(BOXED) + len(BOXED)
    end = closing_brace(text, start)
    return end is not None and text[start:end].strip() != "" and all(ch in _TRAILING_OK for ch in text[end + 1 :])


def format_reward(completions: Sequence[str | Sequence[dict[str, Any]]], **kwargs: Any) -> list[float]:
    r"""1.0 iff ``\boxed{`` occurs exactly once (two answers are ambiguous), its braces balance around non-blank
    content, and only ``_TRAILING_OK`` follows (it ends the completion); else 0.0. Correctness is not checked."""
    return [1.0 if _formatted(completion_text(completion)) else 0.0 for completion in completions]
