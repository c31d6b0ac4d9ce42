"""Every prompt shape `GRPOTrainer` 1.16 accepts passes the data door unchanged: text, image, video and audio content
parts, image placeholders filled from an ``image``/``images`` column (as the ``datasets`` library stores them, with
``'text': None``), media given inline, string content next to an image column, an assistant's tool call. Checked where
the door acts, the trainer's construction, with a tiny Gemma 3 or LLaVA built from config (tests/vlm.py). Training on them:
tests/e2e/test_vlm_training.py."""

from __future__ import annotations

import pytest
from datasets import Dataset
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs
from tests.vlm import character_codes, image, tiny_vlm
from trl_groupopt import GroupOptTrainer
from trl_groupopt.data.checks import check_train_dataset


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


TEXT = {"type": "text", "text": "What color is it?"}
TOOL_CALL = {"type": "function", "function": {"name": "look", "arguments": {}}}
#: shape -> rows (each a dict of columns), as a user writes them for GRPOTrainer
SHAPES = {
    "image placeholder and an image column": lambda: {"prompt": _user({"type": "image"}, TEXT), "image": image()},
    "two placeholders and an images column": lambda: {
        "prompt": _user({"type": "image"}, {"type": "image"}, TEXT), "images": [image(), image("blue")]},
    "inline image": lambda: {"prompt": _user({"type": "image", "image": image()}, TEXT)},
    "image by url": lambda: {"prompt": _user({"type": "image", "url": "https://example.com/a.png"}, TEXT)},
    "image by path": lambda: {"prompt": _user({"type": "image", "path": "a.png"}, TEXT)},
    "video placeholder": lambda: {"prompt": _user({"type": "video"}, TEXT)},
    "video by path": lambda: {"prompt": _user({"type": "video", "path": "clip.mp4"}, TEXT)},
    "audio by path": lambda: {"prompt": _user({"type": "audio", "path": "clip.wav"}, TEXT)},
    "string content and an image column": lambda: {
        "prompt": [{"role": "user", "content": "What color is it?"}], "image": image()},
    "string prompt and an image column": lambda: {"prompt": "What color is it?", "image": image()},
    "system text parts before an image": lambda: {
        "prompt": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                   *_user({"type": "image"}, TEXT)], "image": image()},
    "an assistant's tool call": lambda: {
        "prompt": [{"role": "user", "content": "Look."}, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                   {"role": "tool", "name": "look", "content": "red"}]},
}  # fmt: skip


def _dataset(shape: str) -> Dataset:
    return Dataset.from_list([SHAPES[shape]() for _ in range(4)])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_prompt_shape_grpo_takes_passes_the_door_unchanged(shape, tmp_path):
    dataset = _dataset(shape)
    check_train_dataset(dataset, [character_codes])
    args = GRPOConfig(**cpu_config_kwargs(tmp_path, per_device_train_batch_size=2, num_generations=2))
    model, processor = tiny_vlm("gemma3" if "image" in shape else "llava")
    trainer = GroupOptTrainer(model, character_codes, args=args, train_dataset=dataset, processing_class=processor)
    assert trainer.train_dataset[0] == dataset[0]


def test_the_datasets_library_fills_a_placeholder_with_text_none():
    """The shape TRL's own VLM tests load (``trl-internal-testing/zen-image``): the refused row of the regression."""
    prompt = _dataset("image placeholder and an image column")[0]["prompt"]
    assert prompt[0]["content"][0] == {"type": "image", "text": None}


@pytest.mark.parametrize(
    ("part", "said"),
    [
        ({"type": "picture", "url": "a.png"}, "{'type': 'picture', 'text': None, 'url': 'a.png'}, not a text part"),
        ({"type": "text", "text": None}, "{'type': 'text', 'text': None}, not a text part"),
    ],
)
def test_a_part_no_template_reads_is_refused_naming_the_row_and_the_shapes(part, said):
    rows = [{"prompt": _user(TEXT)}, {"prompt": _user(part)}]
    with pytest.raises(ValueError, match="^train_dataset: row 1: 'prompt' message 0 content part 0 is ") as raised:
        check_train_dataset(Dataset.from_list(rows))
    assert said in str(raised.value) and "{'type': 'image', ...}, {'type': 'video', ...}" in str(raised.value)


def test_content_none_without_a_tool_call_is_refused():
    with pytest.raises(ValueError, match="row 0: 'prompt' message 0 has content None, not text"):
        check_train_dataset(Dataset.from_list([{"prompt": [{"role": "user", "content": None}]}]))
