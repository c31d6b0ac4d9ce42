"""The character-level tokenizer of the synthetic arithmetic task, built in code (no download)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

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


def _vocabulary() -> dict[str, int]:
    tokens = CONTROL_TOKENS + ROLE_TOKENS + WORD_TOKENS + CHAR_TOKENS
    if len(set(tokens)) != len(tokens):  # a duplicate would silently alias two ids
        raise ValueError("duplicate token in the tiny vocabulary")
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer():
    """The task's ``PreTrainedTokenizerFast``: a ``WordLevel`` model over ~70 symbols; ``decode(encode(s)) == s`` for
    text inside the vocabulary, any other character is one ``<unk>``. No post-processor: the chat template writes
    ``<bos>`` itself, so ``add_special_tokens`` never doubles it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = _vocabulary()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words = CONTROL_TOKENS + ROLE_TOKENS + WORD_TOKENS
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


def save_tokenizer(tokenizer, path: str | os.PathLike) -> None:
    """Save ``tokenizer`` so it loads on transformers 5.x and 4.57: 5.x writes ``tokenizer_class:
    TokenizersBackend``, a ``backend`` key and ``extra_special_tokens`` as a list, none of which 4.57 reads; 4.57 would
    also return ``token_type_ids``, which GRPOTrainer passes on to ``generate()``."""
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
    specials = {name: getattr(tokenizer, name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    cfg.update(specials)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    # Both versions read chat_template.jinja; keep the template inline too for older readers.
    if not (path / "chat_template.jinja").exists():
        (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    # 4.x also reads special_tokens_map.json; keep it consistent with the config.
    special_map = {**specials, "additional_special_tokens": list(ROLE_TOKENS)}
    (path / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
