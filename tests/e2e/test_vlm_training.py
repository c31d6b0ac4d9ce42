"""TRL's own vision-language GRPO tests (`TestGRPOTrainerVLM` in TRL's tests/test_grpo_trainer.py: `test_train_vlm`,
`test_train_vlm_with_pad_to_multiple_of`, `test_train_vlm_multi_image`, `test_train_vlm_log_multimodal_false`),
run against this library's trainers offline: a tiny Gemma 3, LLaVA-NeXT and LLaVA built from config (tests/vlm.py) stand
in for TRL's Hub models and a dataset of the shape of ``trl-internal-testing/zen-image`` for its data. The data door refused all of
them once (issue 51); the prompt shapes one by one: tests/trainers/test_vlm_prompts.py."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs
from tests.selection import tested_methods
from tests.vlm import character_codes, image, tiny_vlm
from trl_groupopt import METHODS, GroupOptTrainer

#: LLaVA reads the vision tower's last hidden state, never its pooler's layer norm: that one gets no gradient.
UNUSED = {"llava": ("post_layernorm",), "llava_next": ("post_layernorm",), "gemma3": ()}


def zen_image(images: int = 1, rows: int = 16) -> Dataset:
    """Prompts of the shape of ``trl-internal-testing/zen-image`` ("conversational_prompt_only"), or, with
    `images` > 1, of ``zen-multi-image``: placeholders in the message, the pictures in an image(s) column (16 rows:
    one rollout of CTPO's default schedule)."""
    colors = ["red", "blue", "green", "white"]
    data = []
    for i in range(rows):
        parts = [{"type": "image"}] * images + [{"type": "text", "text": f"What color is picture {i}?"}]
        pictures = [image(colors[(i + j) % len(colors)]) for j in range(images)]
        data.append({"prompt": [{"role": "user", "content": parts}],
                     **({"image": pictures[0]} if images == 1 else {"images": pictures})})  # fmt: skip
    return Dataset.from_list(data)


def _train(tmp_path, kind="llava", trainer_class=GroupOptTrainer, config_class=GRPOConfig, dataset=None, **overrides):
    model, processor = tiny_vlm(kind)
    kwargs = cpu_config_kwargs(tmp_path, per_device_train_batch_size=2, num_generations=2, learning_rate=0.1)
    args = config_class(**{**kwargs, **overrides})
    trainer = trainer_class(model, character_codes, args=args, train_dataset=dataset or zen_image(),
                            processing_class=processor)  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    unchanged = [n for n, p in before.items() if torch.equal(p, trainer.model.get_parameter(n))]
    assert [n for n in unchanged if n.rpartition(".")[0].rpartition(".")[2] not in UNUSED[kind]] == []
    return trainer


@pytest.mark.parametrize("kind", ["gemma3", "llava_next", "llava"])
def test_train_vlm(tmp_path, kind):
    trainer = _train(tmp_path, kind)
    assert all(log["frac_reward_zero_std"] < 1 for log in trainer.state.log_history[:-1])  # a signal to learn from


@pytest.mark.parametrize("kind", ["gemma3", "llava"])  # Gemma 3's `token_type_ids` are padded too
def test_train_vlm_with_pad_to_multiple_of(tmp_path, kind):
    _train(tmp_path, kind, pad_to_multiple_of=7)


def test_train_vlm_multi_image(tmp_path):
    _train(tmp_path, dataset=zen_image(images=2))


def test_train_vlm_log_multimodal_false(tmp_path):
    trainer = _train(tmp_path, "gemma3", log_completions=True, log_multimodal=False)
    assert len(trainer._logs["images"]) == 0


@pytest.mark.parametrize("method", tested_methods())
def test_every_method_trains_on_image_prompts(tmp_path, method):
    spec = METHODS[method]
    _train(tmp_path, "llava", spec.trainer_class, spec.config_class)
