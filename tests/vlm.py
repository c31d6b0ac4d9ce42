"""Tiny vision-language models and their processors, built from config offline (no Hub): LLaVA (a CLIP vision tower
of 2 layers on 16x16 images, 8x8 patches, and a 2-layer Llama), LLaVA-NeXT (the same towers, images tiled on a grid
of 16x16 and 16x32 pinpoints) and Gemma 3 (a 2-layer SigLIP tower, 4 soft tokens per
image, a 2-layer Gemma 3: its forward also takes `token_type_ids`), each with a character-level tokenizer holding its
image tokens and a chat template that reads text, image and video parts. TRL's own VLM tests use Hub models
(``trl-internal-testing/tiny-Gemma3ForConditionalGeneration``, ``tiny-LlavaForConditionalGeneration`` and others);
these are their offline stand-ins (:func:`tiny_vlm`)."""

from __future__ import annotations

import re

import torch
from PIL import Image
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessor,
    Gemma3Processor,
    Gemma3TextConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessor,
    LlavaNextProcessor,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    SiglipVisionConfig,
)

_CONTROL_TOKENS = ["<pad>", "<eos>", "<unk>", "<image>"]
_GEMMA_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "image_token": "<image_soft_token>",
    "eoi_token": "<end_of_image>",
}
#: Renders string content and text, image and video parts (a video as one placeholder word: this model reads none).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' }}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'video' %}[video]"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _tokenizer(image_tokens: dict[str, str], template: str) -> PreTrainedTokenizerFast:
    """A character-level tokenizer whose special tokens include `image_tokens` (the processor's names for them)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    control = list(dict.fromkeys([*_CONTROL_TOKENS, *image_tokens.values()]))
    symbols = control + [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    pattern = "|".join(re.escape(w) for w in control) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(control)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left",
        chat_template=template, extra_special_tokens=image_tokens,
    )  # fmt: skip


def vlm_processor() -> LlavaProcessor:
    """LLaVA's processor: CLIP's image processor at 16x16 and a character-level tokenizer."""
    tokenizer = _tokenizer({"image_token": "<image>"}, CHAT_TEMPLATE)
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    return LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE, num_additional_image_tokens=1,
    )  # fmt: skip


def gemma3_vlm(seed: int = 0) -> tuple[Gemma3ForConditionalGeneration, Gemma3Processor]:
    """A random Gemma 3 VLM and its processor (4 soft tokens per 16x16 image), fp32."""
    template = CHAT_TEMPLATE.replace("<image>", _GEMMA_IMAGE_TOKENS["boi_token"])
    tokenizer = _tokenizer(_GEMMA_IMAGE_TOKENS, template)
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": 16, "width": 16}),
                                tokenizer=tokenizer, chat_template=template, image_seq_length=4)  # fmt: skip
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                image_size=16, patch_size=4, vision_use_head=False)  # fmt: skip
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, sliding_window=64,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    ids = {
        f"{k.removesuffix('_token')}_token_index": tokenizer.convert_tokens_to_ids(v)
        for k, v in _GEMMA_IMAGE_TOKENS.items()
    }
    config = Gemma3Config(vision_config=vision, text_config=text, mm_tokens_per_image=4,
                          boi_token_index=ids["boi_token_index"], eoi_token_index=ids["eoi_token_index"],
                          image_token_index=ids["image_token_index"])  # fmt: skip
    torch.manual_seed(seed)
    return _with_generation_tokens(Gemma3ForConditionalGeneration(config), tokenizer), processor


def _with_generation_tokens(model, tokenizer):
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_vlm(kind: str, seed: int = 0):
    """(model, processor): ``"llava"``, ``"llava_next"`` or ``"gemma3"``."""
    if kind in ("gemma3", "llava_next"):
        return {"gemma3": gemma3_vlm, "llava_next": llava_next_vlm}[kind](seed)
    processor = vlm_processor()
    return vlm_model(processor, seed), processor


def _clip_and_llama(tokenizer) -> tuple[CLIPVisionConfig, LlamaConfig]:
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16,
        patch_size=8, projection_dim=16,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return vision, text


def vlm_model(processor: LlavaProcessor, seed: int = 0) -> LlavaForConditionalGeneration:
    """A random LLaVA sized to `processor`'s vocabulary and images, fp32."""
    vision, text = _clip_and_llama(processor.tokenizer)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    config = LlavaConfig(vision_config=vision, text_config=text, vision_feature_layer=-1, image_token_id=image_token)
    torch.manual_seed(seed)
    return _with_generation_tokens(LlavaForConditionalGeneration(config), processor.tokenizer)


def llava_next_vlm(seed: int = 0) -> tuple[LlavaNextForConditionalGeneration, LlavaNextProcessor]:
    """A random LLaVA-NeXT and its processor (any-resolution tiles on 16x16, 16x32 and 32x16 pinpoints), fp32."""
    pinpoints = [[16, 16], [16, 32], [32, 16]]
    tokenizer = _tokenizer({"image_token": "<image>"}, CHAT_TEMPLATE)
    images = LlavaNextImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                     image_grid_pinpoints=pinpoints)  # fmt: skip
    processor = LlavaNextProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE, num_additional_image_tokens=1,
    )  # fmt: skip
    vision, text = _clip_and_llama(tokenizer)
    config = LlavaNextConfig(vision_config=vision, text_config=text, vision_feature_layer=-1,
                             image_grid_pinpoints=pinpoints, image_token_index=tokenizer.convert_tokens_to_ids("<image>"))  # fmt: skip
    torch.manual_seed(seed)
    return _with_generation_tokens(LlavaNextForConditionalGeneration(config), tokenizer), processor


def image(color: str = "red") -> Image.Image:
    return Image.new("RGB", (20, 20), color=color)


def character_codes(completions, **kwargs) -> list[float]:
    """A reward that differs between sampled completions (TRL's VLM tests reward the length, which a random model's
    8 clipped tokens make equal): the mean character code."""
    return [sum(map(ord, c[0]["content"])) / max(len(c[0]["content"]), 1) / 100 for c in completions]
