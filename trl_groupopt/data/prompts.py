"""The prompts at the data door: their form checked row by row (:func:`check_prompts`), text parts read as text
(:func:`flatten_text_parts`), and, with the model's tokenizer (never the model), rendered by its chat template and
measured (:func:`check_prompt_lengths`): a row the template cannot render is named, characters the tokenizer cannot
encode warn, and the rows longer than the context leaves room for are returned for the caller to drop."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["check_fraction", "check_prompt_lengths", "check_prompts", "flatten_text_parts"]

#: How a message's content may be a list: OpenAI's and TRL's text parts.
TEXT_PART = "{'type': 'text', 'text': ...}"
#: The other content parts a processor's chat template reads (TRL's vision-language prompts): a placeholder such as
#: ``{'type': 'image'}`` filled from the row's ``image``/``images`` column, or the media itself (``'image'``, ``'url'``,
#: ``'path'``); keys the ``datasets`` library adds as ``None`` (``{'type': 'image', 'text': None}``) are ignored.
MEDIA_PARTS = ("image", "video", "audio")


def _part_problem(part: Any, media: bool) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str) or media and kind in MEDIA_PARTS:
        return None
    if not media:  # the command line loads a tokenizer, not a processor
        return (
            f"is {str(part)[:80]}, not a text part {TEXT_PART} (the command line trains text models; image, video "
            "and audio parts need the Python API with a vision-language model)"
        )
    kinds = ", ".join(f"{{'type': {k!r}, ...}}" for k in MEDIA_PARTS)
    return f"is {str(part)[:80]}, not a text part {TEXT_PART} or a media part ({kinds})"


def _content_problem(message: dict, media: bool) -> str | None:
    content = message["content"]
    if isinstance(content, str) or content is None and message.get("tool_calls"):  # an assistant's tool call
        return None
    if not isinstance(content, list):
        return f"has content {content!r}, not text"
    for j, part in enumerate(content):
        if (problem := _part_problem(part, media)) is not None:
            return f"content part {j} {problem}"
    return None


def _message_problem(messages: list, media: bool) -> str | None:
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not {"role", "content"} <= set(message):
            return f"message {i} is not a {{'role', 'content'}} mapping"
        if not isinstance(message["role"], str) or not message["role"]:
            return f"message {i} has role {message['role']!r}, not a name such as 'user'"
        if (problem := _content_problem(message, media)) is not None:
            return f"message {i} {problem}"
    return None


def check_prompts(
    prompts: Sequence[Any], column: str, source: str, messages_allowed: bool, media_allowed: bool = False
) -> None:
    """Each prompt is a string or (`messages_allowed`) a list of ``{"role", "content"}`` messages whose content is
    text or a list of text parts, and (`media_allowed`: every shape ``GRPOTrainer`` takes) image, video and audio
    parts, all in one form, not all empty: checked row by row, before any conversion."""
    forms: dict[str, int] = {}
    for row, prompt in enumerate(prompts):
        if isinstance(prompt, list) and prompt and messages_allowed:
            problem = _message_problem(prompt, media_allowed)
            forms.setdefault("a list of messages", row)
        else:
            problem = None if isinstance(prompt, str) else f"is {prompt!r}, not a string"
            forms.setdefault("a string", row)
        if problem is not None:
            raise ValueError(f"{source}: row {row}: {column!r} {problem}. Fix or drop that row.")
    if len(forms) > 1:
        rows = " and ".join(f"row {row} holds {form}" for form, row in forms.items())
        raise ValueError(
            f"{source}: {column!r} mixes forms ({rows}): write every prompt the same way, "
            "as a string or as [{'role': 'user', 'content': ...}]."
        )
    if all(isinstance(p, str) and not p.strip() for p in prompts):
        raise ValueError(f"{source}: every {column!r} is empty: there is nothing to prompt with.")


def flatten_text_parts(row: dict[str, Any]) -> dict[str, Any]:
    """A row whose messages' content is a list of text parts, with that content as one string (the parts joined as a
    chat template that reads parts joins them): a text model's template reads strings. A message with a media part
    is kept as it is (a processor's template reads it)."""
    prompt = row["prompt"]
    if not isinstance(prompt, list):
        return row
    flat = [{**m, "content": "".join(p["text"] for p in m["content"])} if _text_parts_only(m["content"]) else m
            for m in prompt]  # fmt: skip
    return {**row, "prompt": flat}


def _text_parts_only(content: Any) -> bool:
    return isinstance(content, list) and all(part.get("type") == "text" for part in content)


def check_fraction(bad: list[int], total: int, what: str, name: str, option: str, limit: float, fix: str,
                   outcome: str) -> None:  # fmt: skip
    """More than `limit` of `total` rows in `bad` raises naming `option`; fewer warns, saying what becomes of them
    (`outcome`); none passes."""
    if not bad:
        return
    message = f"--dataset_name {name}: {len(bad)} of {total} rows ({len(bad) / total:.1%}) {what}"
    if len(bad) / total > limit:
        raise ValueError(f"{message}. That is more than --{option} {limit}: {fix} (or raise --{option}).")
    warnings.warn(f"{message}. {outcome}; to use them, {fix}.", UserWarning, stacklevel=4)


def _render(tokenizer, prompts: Sequence[Any], name: str) -> list[str]:
    """Each prompt as the trainer will send it: messages through the chat template, strings as they are."""
    texts = []
    for row, prompt in enumerate(prompts):
        if not isinstance(prompt, list):
            texts.append(prompt)
            continue
        try:
            texts.append(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        except Exception as err:  # jinja2's errors name neither the row nor the fix
            roles = sorted({str(m.get("role")) for m in prompt if isinstance(m, dict)})
            raise ValueError(
                f"--dataset_name {name}: row {row}: the model's chat template cannot render this prompt (roles "
                f"{roles}; {type(err).__name__}: {err}). Use the roles the template reads (usually 'system', 'user' "
                "and 'assistant'), or fix or drop that row."
            ) from None
    return texts


def _warn_unencodable(tokenizer, texts: list[str], encoded, name: str) -> None:
    """Warn naming the characters of the prompts the tokenizer turns into its unknown token."""
    unk = tokenizer.unk_token_id
    if unk is None or "offset_mapping" not in encoded:
        return
    found: dict[str, int] = {}  # character -> first row
    rows = 0
    for row, (text, ids, offsets) in enumerate(zip(texts, encoded["input_ids"], encoded["offset_mapping"])):
        spans = [text[start:end] for token, (start, end) in zip(ids, offsets) if token == unk]
        spans = [s for s in spans if s and s != tokenizer.unk_token]
        rows += bool(spans)
        for span in spans:
            found.setdefault(span, row)
    if found:
        shown = ", ".join(repr(c) for c in sorted(found)[:20]) + (" ..." if len(found) > 20 else "")
        warnings.warn(
            f"--dataset_name {name}: the model's tokenizer cannot encode {shown} ({rows} of {len(texts)} prompts, "
            f"e.g. row {min(found.values())}): each becomes {tokenizer.unk_token}, so the model never reads them. "
            "Rewrite those characters in your data, or train a model whose tokenizer has them.",
            UserWarning,
            stacklevel=4,
        )


def check_prompt_lengths(data, name: str, tokenizer, context: int | None, completion: int, limit: float) -> list[int]:
    """Render and measure every prompt with the tokenizer (a row its chat template cannot render raises; characters
    it cannot encode warn); returns the rows longer than the context leaves room for, checked against
    ``--max_overlong_prompt_fraction`` (above it raises; at or below, the caller drops them)."""
    texts = _render(tokenizer, data["prompt"], name)
    offsets = getattr(tokenizer, "is_fast", False)
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=offsets)
    if os.environ.get("RANK", "0") == "0":
        _warn_unencodable(tokenizer, texts, encoded, name)
    if context is None:
        return []
    lengths = [len(ids) for ids in encoded["input_ids"]]
    bad = [i for i, n in enumerate(lengths) if n > context - completion]
    example = f"; e.g. row {bad[0]}: {lengths[bad[0]]} tokens" if bad else ""
    what = (
        f"have prompts longer than the {context - completion} tokens the model's context leaves ({context} "
        f"positions minus --max_completion_length {completion}){example}"
    )
    fix = "shorten or drop those rows, or lower --max_completion_length"
    outcome = "They are dropped: training goes on without them"
    check_fraction(bad, len(lengths), what, name, "max_overlong_prompt_fraction", limit, fix, outcome)
    return bad
