r"""Reward functions with TRL's signature ``f(completions, **kwargs) -> list[float | None]``.

``completions`` may be conversational (each a list of ``{"role", "content"}`` dicts, as
GRPOTrainer passes them for conversational datasets) or plain strings (standard datasets); both
are accepted. Dataset columns arrive as keyword arguments (``solution=...``), and the trainer
also passes ``prompts``, ``completion_ids``, ``trainer_state``, ``log_extra`` and ``log_metric``,
which are accepted and, except ``log_extra``, ignored.

- :func:`accuracy_reward`: ``trl.rewards.accuracy_reward`` (math-verify; the answer must be boxed, an
  unparseable gold gives ``None``), wrapped to accept every completion shape.
- :func:`format_reward`: 1.0 iff the completion has exactly one well-formed ``\boxed{...}`` and
  it ends the completion (rule in its docstring).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["accuracy_reward", "closing_brace", "completion_text", "extract_last_boxed", "format_reward"]

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
    solution: Sequence[str | None],
    log_extra: Callable[[str, list], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""``trl.rewards.accuracy_reward`` (math-verify; boxed answer first) for any completion shape.

    TRL's function reads ``completion[0]["content"]`` of conversational completions only; this wrapper also
    accepts plain strings (standard datasets), multi-message completions (the last message is scored, see
    :func:`completion_text`) and ``None`` solutions (unparseable gold: reward ``None``, skipped by the trainer).
    The answer must be boxed (or in an anchored LaTeX form): ``"... -11"`` scores 0.
    """
    from trl.rewards import accuracy_reward as trl_accuracy_reward

    if len(completions) != len(solution):
        raise ValueError(f"got {len(completions)} completions but {len(solution)} solutions")
    messages = [[{"role": "assistant", "content": completion_text(c)}] for c in completions]
    gold = ["" if s is None else str(s) for s in solution]
    return trl_accuracy_reward(messages, gold, log_extra=log_extra, **kwargs)


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
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched.

    ``\\boxed 5`` (no braces) gives ``"5"``; returns ``None`` when there is none or it is unclosed.
    """
    starts = list(_BOXED_START.finditer(text))
    if not starts:
        return None
    m = starts[-1]
    if m.group(1) != "{":  # "\boxed 5": a bare token
        return m.group(2).rstrip("$.")
    end = closing_brace(text, m.end())
    return None if end is None else text[m.end() : end]


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
            start = text.index(BOXED) + len(BOXED)
            end = closing_brace(text, start)
            ok = (
                end is not None and text[start:end].strip() != "" and all(ch in _TRAILING_OK for ch in text[end + 1 :])
            )
        rewards.append(1.0 if ok else 0.0)
    return rewards
