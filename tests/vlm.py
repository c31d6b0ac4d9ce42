"""A tiny vision-language model and its processor, built from config offline (no Hub): LLaVA (a CLIP vision tower
of 2 layers on 16x16 images, 8x8 patches, and a 2-layer Llama), a character-level tokenizer with an ``<image>`` token,
and a chat template that reads text, image and video parts. TRL's own VLM tests use Hub models
(``trl-internal-testing/tiny-LlavaForConditionalGeneration`` and others); this is their offline stand-in."""

from __future__ import annotations

import re

import torch
from PIL import Image
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

_CONTROL_TOKENS = ["<pad>", "<eos>", "<unk>", "<image>"]
#: Renders string content and text, image and video parts (a video as one placeholder word: this model reads none).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' }}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'video' %}[video]"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def vlm_processor() -> LlavaProcessor:
    """LLaVA's processor: CLIP's image processor at 16x16 and a character-level tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    symbols = _CONTROL_TOKENS + [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    pattern = "|".join(re.escape(w) for w in _CONTROL_TOKENS) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(_CONTROL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left",
        chat_template=CHAT_TEMPLATE, extra_special_tokens={"image_token": "<image>"},
    )  # fmt: skip
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    return LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE, num_additional_image_tokens=1,
    )  # fmt: skip


def vlm_model(processor: LlavaProcessor, seed: int = 0) -> LlavaForConditionalGeneration:
    """A random LLaVA sized to `processor`'s vocabulary and images, fp32."""
    tokenizer = processor.tokenizer
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16,
        patch_size=8, projection_dim=16,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision, text_config=text, vision_feature_layer=-1,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def image(color: str = "red") -> Image.Image:
    return Image.new("RGB", (20, 20), color=color)


def character_codes(completions, **kwargs) -> list[float]:
    """A reward that differs between sampled completions (TRL's VLM tests reward the length, which a random model's
    8 clipped tokens make equal): the mean character code."""
    return [sum(map(ord, c[0]["content"])) / max(len(c[0]["content"]), 1) / 100 for c in completions]
