"""The model card of a trained run: every knob, the reward summary and the citations, written where TRL saves
(the rendering checks that need no training: tests/hub/test_model_card.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from trl import GRPOConfig

from tests.helpers import (
    clone_model,
    cpu_config_kwargs,
    length_reward,
    method_trainer,
    tiny_dataset,
)
from tests.hub.test_model_card import CARD_KNOBS, FAKE_TOKEN, _bibtex_key, _front_matter
from tests.selection import tested_methods
from trl_groupopt import OTBConfig, OTBTrainer, get_method
from trl_groupopt.trainer.card import MATH_QUESTION, render_model_card


@pytest.mark.parametrize("method", tested_methods())
def test_model_card_renders_method_knobs_rewards_and_citations(method, tokenizer, base_model, tmp_path, monkeypatch):
    """Train 1 step, render: method name, every knob of the method's own config, the reward curve, the method's and
    TRL's BibTeX, and no token."""
    from trl_groupopt.trainer.card import create_model_card

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    trainer_cls = get_method(method).trainer_class
    trainer = method_trainer(method, tmp_path / "run", clone_model(base_model), tokenizer, num_generations=2,
                             max_steps=1, hub_token=FAKE_TOKEN)  # fmt: skip
    args = trainer.args
    trainer.train()
    card = render_model_card(trainer, dataset_name="openai/gsm8k", tags=["extra-tag"])

    meta = _front_matter(card)
    assert meta["datasets"] == "openai/gsm8k" and meta["library_name"] == "transformers"
    assert "[openai/gsm8k](https://huggingface.co/datasets/openai/gsm8k)" in card
    assert "base_model" not in meta and "a model initialised from a configuration" in card  # built from a config
    assert {*trainer_cls._tag_names, "extra-tag", "generated_from_trainer"} <= set(meta["tags"])
    assert f"trained with **{trainer_cls._name}** (`{trainer_cls.__name__}`)" in card
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    knobs = [f.name for f in dataclasses.fields(args) if f.name not in grpo_fields and not f.name.startswith("_")]
    for knob in knobs:  # every knob of the method's own config is listed, with its value
        assert re.search(rf"\n\| `{knob}` \| `[^`\n]+` \| \(method-specific\) \|\n", card), knob
    if method in CARD_KNOBS:
        assert CARD_KNOBS[method] in card
    assert "| `max_completion_length` | `8` | `512` |" in card  # a GRPO setting that differs from the default
    assert "| `use_vllm` |" not in card  # ...and one that does not is left out
    if args.steps_per_generation == args.gradient_accumulation_steps:  # derived by GRPOConfig, never set: not listed
        assert "| `steps_per_generation` |" not in card
    else:  # the method's own off-policy default schedule (ECHO, CTPO) is a real setting: listed
        assert f"| `steps_per_generation` | `{args.steps_per_generation}` | `1` |" in card
    (entry,) = [e for e in trainer.state.log_history if "reward" in e]
    reward = f"{entry['reward']:.4g}"
    assert f"| `reward` | {reward} (step 1) | {reward} (step 1) |" in card
    assert "| `rewards/length_reward/mean` |" in card and "Optimizer steps: 1;" in card
    assert trainer_cls._paper["citation"].strip() in card
    assert "{" + _bibtex_key(trainer_cls._paper["citation"]) + "," in card
    assert "@software{vonwerra2020trl," in card and "- trl-groupopt: " in card and "- TRL: " in card
    if trainer_cls._paper.get("id"):
        assert f"https://huggingface.co/papers/{trainer_cls._paper['id']}" in card
    assert f"question = {json.dumps(MATH_QUESTION[0])}" in card  # a GSM8K-style task: a word problem
    assert FAKE_TOKEN not in card and "hf_QwErTy" not in card and "hub_token" not in card

    path = create_model_card(trainer, dataset_name="openai/gsm8k")  # the hook the trainers call
    assert Path(path) == Path(args.output_dir) / "README.md"
    assert Path(path).read_text(encoding="utf-8") == render_model_card(trainer, dataset_name="openai/gsm8k")


# ------------------------------------------------------------------------------------------------ where it is written
def test_trl_checkpoint_and_save_model_write_our_card(tokenizer, base_model, tmp_path):
    """TRL's own call site (`_save_checkpoint` -> `self.create_model_card`) writes trl-groupopt's card in the output
    folder, and every saved model folder (the checkpoint's, `save_model`'s) holds it too. Fails without the hooks."""
    args = OTBConfig(**cpu_config_kwargs(tmp_path / "otb-run", num_generations=2, max_steps=1, save_strategy="steps",
                                         save_steps=1))  # fmt: skip
    trainer = OTBTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(32),
                         processing_class=tokenizer)  # fmt: skip
    trainer.train()
    output_dir = Path(args.output_dir)
    for folder in (output_dir, output_dir / "checkpoint-1"):
        card = (folder / "README.md").read_text(encoding="utf-8")
        assert "### Method configuration" in card and "| `otb_token_positions` | `valid` |" in card, folder
        assert "### Training reward" in card and "@article{li2026optimal," in card
    trainer.create_model_card(model_name="otb-run", dataset_name="openai/gsm8k")
    assert (output_dir / "README.md").read_text(encoding="utf-8") == render_model_card(
        trainer, model_name="otb-run", dataset_name="openai/gsm8k"
    )
    (output_dir / "README.md").unlink()
    trainer.save_model()
    assert (output_dir / "README.md").read_text(encoding="utf-8") == render_model_card(trainer)
