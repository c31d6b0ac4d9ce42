"""Adapters from the usual math datasets to TRL's conversational prompt-only format.

``{"prompt": [{"role": "user", "content": ...}], "solution": "\\boxed{...}"}``, usable with ``Dataset.map``:
:func:`gsm8k_to_conversational` (GSM8K, answer after ``####``), :func:`math_to_conversational` (MATH, last
``\\boxed{}`` of the solution) and :func:`string_prompt_to_conversational` (a plain-string ``prompt``).
"""

from __future__ import annotations

from typing import Any

from .rewards import extract_last_boxed

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


def string_prompt_to_conversational(row: dict[str, Any], system_prompt: str | None = None) -> dict[str, Any]:
    """Map a row whose ``prompt`` is a plain string to one user message (other columns are kept by ``map``).

    A chat model given the raw string continues the text instead of answering it; as a message, the trainer applies
    the tokenizer's chat template, as it does for conversational prompts."""
    return {"prompt": _messages(str(row["prompt"]), system_prompt)}
