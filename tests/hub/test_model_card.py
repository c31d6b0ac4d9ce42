"""The model card, without pushing: `trl_groupopt.model_card` renders TRL's card plus the method section, from the
package template, with honest metadata and no secret. The card of a trained run, and TRL's own call sites and
`save_model` writing it: tests/e2e/test_model_card_training.py.

(The push of this card to a Hub, end to end, is in `tests/hub/test_push.py`.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from trl import GRPOConfig

from tests.helpers import (
    BUILT_IN_METHODS,
    clone_model,
    cpu_config_kwargs,
    length_reward,
    tiny_dataset,
)
from trl_groupopt import METHODS, ECHOConfig, ECHOTrainer, get_method
from trl_groupopt.model_card import (
    ARITHMETIC_QUESTION,
    GENERIC_QUESTION,
    REDACTED,
    SYNTHETIC_DATASET_NAME,
    TEMPLATE_PATH,
    TRL_SECTIONS,
    _sections,
    method_knobs,
    render_model_card,
    reward_summary,
)
from trl_groupopt.trainers.base import GroupOptTrainer

ROOT = Path(__file__).resolve().parents[2]
CARD_KNOBS = {  # registry name -> one exact knob row (value formatted) the card must show, on top of the generic check
    "echo": "| `batch_epsilon` | `0.2` | (method-specific) |",
    "dfpo": "| `dfpo_transform` | `min_replace` | (method-specific) |",
    "grpo_fix": "| `dfpo_transform` | `symmetric_clip` | (method-specific) |",
    "ctpo": "| `ctpo_dual_clip` | `0.05` | (method-specific) |",
    "otb": "| `otb_token_positions` | `valid` | (method-specific) |",
}
FAKE_TOKEN = "hf_" + "QwErTy0123456789" * 2 + "zz"  # shaped like a real access token (hf_ + 34 characters)


def _bibtex_key(citation: str) -> str:
    return citation.strip().split("{", 1)[1].split(",", 1)[0]


def _front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, re.DOTALL)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


# ------------------------------------------------------------------------------------------------ the template
def test_template_is_package_data_and_has_no_copy():
    """One template, shipped in the wheel (pyproject's package-data); `model_cards/` only points to it."""
    assert TEMPLATE_PATH.is_file() and "{{ card_data }}" in TEMPLATE_PATH.read_text(encoding="utf-8")
    package_data = re.search(
        r"\[tool\.setuptools\.package-data\]\n(.*?)\n\n", (ROOT / "pyproject.toml").read_text(), re.S
    )
    assert '"templates/*.md"' in package_data.group(1)
    copies = [p for p in ROOT.rglob("*.md") if ".git" not in p.parts and p != Path(str(TEMPLATE_PATH))
              and "{{ card_data }}" in p.read_text(encoding="utf-8", errors="ignore")]  # fmt: skip
    assert not copies, copies
    readme = (ROOT / "model_cards" / "README.md").read_text(encoding="utf-8")
    assert "trl_groupopt/templates/model_card.md" in readme
    # The README's table documents the shipped methods (a new method's citation lives in its docs/<method>.md).
    for trainer_cls in {get_method(m).trainer_class for m in BUILT_IN_METHODS} - {GroupOptTrainer}:
        assert f"`{_bibtex_key(trainer_cls._paper['citation'])}`" in readme, trainer_cls.__name__


def test_trl_sections_are_found_in_trls_card():
    """The parts reused from TRL's card exist in the installed TRL's template (else the card would lose them)."""
    from trl.trainer.utils import generate_model_card

    card = generate_model_card(base_model=None, model_name="m", hub_model_id="u/m", dataset_name=None, tags=["t"],
                               wandb_url=None, trackio_url=None, trainer_name="X", trainer_citation="@misc{x, t={y}}",
                               paper_title="P", paper_id="2402.03300")  # fmt: skip
    sections = _sections(card.text)
    assert all(sections.get(name) for name in TRL_SECTIONS), sections.keys()
    assert "This model was trained with X, a method introduced in [P]" in sections["Training procedure"]
    assert "- TRL: " in sections["Framework versions"]
    assert "@misc{x, t={y}}" in sections["Citations"] and "@software{vonwerra2020trl," in sections["Citations"]


# ------------------------------------------------------------------------------------------------ rendering
@pytest.mark.parametrize("method", list(METHODS))
def test_model_card_metadata(method):
    """Every registered trainer names itself, tags the card and cites its paper in BibTeX."""
    trainer_cls = get_method(method).trainer_class
    assert trainer_cls._name and "trl-groupopt" in trainer_cls._tag_names
    assert {"title", "id", "citation"} <= trainer_cls._paper.keys()
    assert trainer_cls._paper["citation"].lstrip().startswith("@")


@pytest.fixture(scope="module")
def untrained(tokenizer, base_model, tmp_path_factory):
    """An ECHO trainer that never trained, for the metadata checks (its model's `_name_or_path` is changed per test)."""
    args = ECHOConfig(**cpu_config_kwargs(tmp_path_factory.mktemp("untrained"), num_generations=2))
    return ECHOTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(32),
                       processing_class=tokenizer)  # fmt: skip


def test_base_model_and_dataset_metadata(untrained, tmp_path, monkeypatch):
    """`base_model`/`datasets` metadata and links only for Hub ids; local paths never reach the card."""
    from trl_groupopt.offline import EMBEDDED_POLICY_PATH

    config = untrained.model.config
    monkeypatch.setattr(config, "_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct")
    card = render_model_card(untrained, dataset_name="openai/gsm8k")
    assert _front_matter(card)["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (
        "fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct](https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct)" in card
    )
    assert "No training reward was logged." in card

    local = tmp_path / "my-private-model"
    local.mkdir()
    monkeypatch.setattr(config, "_name_or_path", str(local))
    card = render_model_card(untrained, dataset_name=str(tmp_path / "data.jsonl"))
    assert "base_model" not in _front_matter(card) and "datasets" not in _front_matter(card)
    assert str(tmp_path) not in card and "a local model (not on the Hub)" in card
    assert "the local dataset `data.jsonl` (not on the Hub)" in card
    assert f"question = {json.dumps(GENERIC_QUESTION[0])}" in card  # an unknown task: TRL's question

    monkeypatch.setattr(config, "_name_or_path", EMBEDDED_POLICY_PATH)
    card = render_model_card(untrained)  # no dataset named: the embedded policy's own task
    assert "base_model" not in _front_matter(card) and EMBEDDED_POLICY_PATH not in card
    assert "embedded tiny policy (`trl_groupopt/assets/tiny_policy`" in card
    assert f"question = {json.dumps(ARITHMETIC_QUESTION[0])}" in card
    card = render_model_card(untrained, dataset_name=SYNTHETIC_DATASET_NAME, question="Compute 1+1")
    assert "synthetic arithmetic task" in card and "datasets/synthetic-arithmetic" not in card
    assert 'question = "Compute 1+1"' in card


def test_arithmetic_question_is_in_the_task_format():
    from trl_groupopt.offline import evaluate_expression, expression_of_prompt

    question, max_new_tokens = ARITHMETIC_QUESTION
    assert evaluate_expression(expression_of_prompt(question)) == 16 and max_new_tokens >= 43


def test_model_card_redacts_token_shaped_values():
    """Unit: secret-named fields are skipped and token-shaped strings are redacted, whatever field carries them."""
    from dataclasses import dataclass, field

    @dataclass
    class LeakyConfig(GRPOConfig):
        my_api_token: str = field(default=FAKE_TOKEN)
        my_note: str = field(default=f"pushed with {FAKE_TOKEN}")

    rows = {
        row["name"]: row
        for row in method_knobs(LeakyConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False))
    }
    assert "my_api_token" not in rows and "hub_token" not in rows
    assert rows["my_note"]["value"] == f"pushed with {REDACTED}"
    history = [{"reward": 0.5, "step": 1}, {"reward": float("nan"), "step": 2}, {"reward": 0.9, "step": 3},
               {"reward": 0.7, "step": 4}, {"loss": 1.0, "step": 4}]  # fmt: skip
    (row,) = reward_summary(history)["rows"]
    assert (row["first"], row["first_step"], row["last"], row["last_step"]) == ("0.5", 1, "0.7", 4)
    assert (row["best"], row["best_step"], row["num_logged"]) == ("0.9", 3, 3)
    assert reward_summary([{"loss": 1.0, "step": 1}]) is None


def test_knobs_list_only_what_differs_from_grpo_defaults(tmp_path):
    """`steps_per_generation` is listed only when it differs from what GRPOConfig derives (accumulation steps)."""
    names = {
        row["name"] for row in method_knobs(GRPOConfig(**cpu_config_kwargs(tmp_path, gradient_accumulation_steps=2)))
    }
    assert "steps_per_generation" not in names and "gradient_accumulation_steps" in names
    rows = {
        row["name"]: row for row in method_knobs(GRPOConfig(**cpu_config_kwargs(tmp_path, steps_per_generation=4)))
    }
    assert rows["steps_per_generation"]["value"] == "4" and rows["steps_per_generation"]["default"] == "1"
