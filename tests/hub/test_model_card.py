"""The model card, without pushing: `trl_groupopt.trainer.card` renders TRL's card plus the method section, from the
package template, with honest metadata and no secret. The card of a trained run, and TRL's own call sites and
`save_model` writing it: tests/e2e/test_model_card_training.py.

(The push of this card to a Hub, end to end, is in `tests/hub/test_push.py`.)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from transformers.trainer_utils import SchedulerType
from trl import GRPOConfig

from tests.helpers import (
    clone_model,
    cpu_config_kwargs,
    length_reward,
    tiny_dataset,
)
from tests.selection import tested_methods
from trl_groupopt import METHODS, ECHOConfig, ECHOTrainer, Paper, get_method
from trl_groupopt.trainer.card import (
    ARITHMETIC_QUESTION,
    GENERIC_QUESTION,
    REDACTED,
    SYNTHETIC_DATASET_NAME,
    TEMPLATE_PATH,
    TRL_KEPT_FROM,
    heldout_summary,
    method_knobs,
    render_model_card,
    reward_summary,
)

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
    # The citations come from the specs; the README points there and lists none (nothing to edit for a new method).
    assert "trl_groupopt/methods/<name>/spec.py" in readme
    for name in METHODS:
        assert _bibtex_key(get_method(name).trainer_class._paper["citation"]) not in readme, name


def test_card_keeps_trls_own_card_from_training_procedure_on(untrained):
    """The card is TRL's (`GRPOTrainer.create_model_card`, the installed TRL's template) from "Training procedure"
    on, byte for byte, with our sections after it; TRL's introduction and quick start are replaced, not repeated."""
    from trl import GRPOTrainer

    GRPOTrainer.create_model_card(untrained, model_name="m")  # TRL's own card, written to args.output_dir
    trl = (Path(untrained.args.output_dir) / "README.md").read_text(encoding="utf-8")
    kept = re.sub(r"[ \t]+\n", "\n", TRL_KEPT_FROM + trl.partition(TRL_KEPT_FROM)[2]).strip()
    kept = re.sub(r"\n{3,}", "\n\n", kept)
    assert f"This model was trained with {untrained._name}" in kept and "- TRL: " in kept
    assert untrained._paper["citation"].strip() in kept and "@software{vonwerra2020trl," in kept
    card = render_model_card(untrained, model_name="m")
    assert kept in card and card.index("## Quick start") < card.index(kept) < card.index("### Method configuration")
    assert card.count("## Quick start") == 1 and card.count("# Model Card for m") == 1


# ------------------------------------------------------------------------------------------------ rendering
@pytest.mark.parametrize("method", tested_methods())
def test_model_card_metadata(method):
    """Every registered trainer names itself, tags the card and cites its paper in BibTeX, all from its spec."""
    spec = get_method(method)
    trainer_cls = spec.trainer_class
    assert trainer_cls._name and "trl-groupopt" in trainer_cls._tag_names
    assert {"title", "id", "citation"} <= trainer_cls._paper.keys()
    assert trainer_cls._paper["citation"].lstrip().startswith("@")
    if isinstance(spec.paper, Paper):
        assert trainer_cls._paper == spec.paper.trl_fields(), method


@pytest.fixture(scope="module")
def untrained(tokenizer, base_model, tmp_path_factory):
    """An ECHO trainer that never trained, for the metadata checks (its model's `_name_or_path` is changed per test)."""
    args = ECHOConfig(**cpu_config_kwargs(tmp_path_factory.mktemp("untrained"), num_generations=2))
    return ECHOTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(32),
                       processing_class=tokenizer)  # fmt: skip


def test_base_model_and_dataset_metadata(untrained, tmp_path, monkeypatch):
    """`base_model`/`datasets` metadata and links only for Hub ids; local paths never reach the card."""
    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

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
    from trl_groupopt.data.offline import evaluate_expression

    question, max_new_tokens = ARITHMETIC_QUESTION
    assert question.startswith("Compute ")
    assert evaluate_expression(question.removeprefix("Compute ")) == 16 and max_new_tokens >= 43


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
    (row,) = reward_summary(history)["rows"]  # 3 logged points: each 10% end is one point
    assert (row["first"], row["first_steps"], row["last"], row["last_steps"]) == ("0.5", "step 1", "0.7", "step 4")
    assert (row["num_logged"], row["num_averaged"]) == (3, 1)
    assert reward_summary([{"loss": 1.0, "step": 1}]) is None


def test_reward_summary_averages_the_first_and_last_tenth():
    """Means over the first and the last 10% of the logged steps (rounded up), not single noisy points."""
    rewards = [0.0, 0.5] + [0.9] * 16 + [0.25, 0.75]  # 20 logged steps: 2 at each end
    history = [{"reward": r, "rewards/accuracy_reward/mean": r, "step": 2 * (i + 1)} for i, r in enumerate(rewards)]
    summary = reward_summary(history, num_steps=40)
    total, accuracy = summary["rows"]
    assert (total["first"], total["first_steps"], total["last"], total["last_steps"]) == (
        "0.25", "steps 2-4", "0.5", "steps 38-40")  # fmt: skip
    assert accuracy["name"] == "rewards/accuracy_reward/mean" and accuracy["first"] == "0.25"
    assert (summary["num_logged"], summary["num_averaged"], summary["num_steps"]) == (20, 2, 40)
    assert reward_summary(history + [{"reward": 1.0, "step": 42}])["num_averaged"] == 3  # 21 logged: 3 per end


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


# ------------------------------------------------------------------------------------------------ issue 30
def test_card_license_and_enum_values(untrained, monkeypatch):
    """No `licence: license` (TRL's stray key); `license` only when known (the embedded policy's, or the caller's);
    enum settings by value (`constant`, not `SchedulerType.CONSTANT`)."""
    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

    monkeypatch.setattr(untrained.args, "lr_scheduler_type", SchedulerType("constant"))
    card = render_model_card(untrained)
    meta = _front_matter(card)
    assert "licence" not in meta and "license" not in meta  # a model from a config: its license is unknown
    assert "| `lr_scheduler_type` | `constant` | `linear` |" in card and "SchedulerType" not in card
    assert _front_matter(render_model_card(untrained, license="mit"))["license"] == "mit"
    monkeypatch.setattr(untrained.model.config, "_name_or_path", EMBEDDED_POLICY_PATH)
    assert _front_matter(render_model_card(untrained))["license"] == "apache-2.0"  # the package's, pyproject.toml


def _quick_start_model(card: str) -> str:
    return re.search(r'pipeline\("text-generation", model="([^"]+)"', card).group(1)


def test_quick_start_loads_from_any_folder(untrained, tmp_path, monkeypatch):
    """Locally: the absolute path of the card's folder (a relative one works only where the run started); after a
    push: the repo id."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(untrained.args, "output_dir", "outputs/echo-demo")
    assert _quick_start_model(render_model_card(untrained)) == str(tmp_path / "outputs" / "echo-demo")
    assert _quick_start_model(render_model_card(untrained, output_dir="elsewhere")) == str(tmp_path / "elsewhere")
    monkeypatch.setattr(untrained.args, "hub_model_id", "me/echo-demo")
    assert _quick_start_model(render_model_card(untrained)) == str(tmp_path / "outputs" / "echo-demo")  # no push
    monkeypatch.setattr(untrained.args, "push_to_hub", True)
    assert _quick_start_model(render_model_card(untrained)) == "me/echo-demo"
    monkeypatch.setattr(untrained.args, "push_to_hub", False)
    monkeypatch.setattr(untrained, "hub_model_id", "me/echo-demo")  # `push_to_hub()` created the repo
    assert _quick_start_model(render_model_card(untrained)) == "me/echo-demo"


def test_card_states_heldout_accuracy_and_the_mechanism_report(untrained, monkeypatch):
    """The held-out accuracy when the run measured it, and what the method's mechanism did."""
    card = render_model_card(untrained)
    assert "Held-out" not in card  # not measured: no line
    assert "### Did the method's mechanism act?" in card
    assert "- ECHO's batch clip: not measured" in card and "- Advantage estimator: `grpo`." in card
    monkeypatch.setattr(untrained, "heldout_accuracy", {"before": 0.18, "after": 0.315, "num_examples": 200})
    card = render_model_card(untrained)
    assert "Held-out greedy-decoding accuracy (200 prompts): **18.0% before training, 31.5% after**." in card
    assert heldout_summary(None) is None and heldout_summary({"before": 0.1, "after": None}) is None


# ------------------------------------------------------------------------------------------------ issue 38
EVIL_NAME = "evil`<img src=x onerror=alert(1)>`---.jsonl"


def _html_tags(card: str) -> list[str]:
    """The HTML tags a CommonMark renderer (raw HTML allowed, as on the Hub) makes of the card body: markdown's own
    tags and any raw HTML that sits outside a code span."""
    from markdown_it import MarkdownIt

    body = card.split("\n---\n", 1)[1]
    return re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", MarkdownIt("commonmark").enable("table").render(body))


def test_names_the_user_chose_put_no_raw_html_in_the_body(untrained, monkeypatch):
    """A data file named like an HTML injection, a config string and a run name holding backticks and tags are shown
    verbatim (inside a code span, or escaped), never as HTML: only markdown's own tags appear."""
    monkeypatch.setattr(untrained.args, "batch_ratio_scope", "`<script>alert(2)</script>`")
    card = render_model_card(
        untrained, model_name="run<img src=y onerror=alert(3)>", dataset_name=f"/data/{EVIL_NAME}"
    )
    assert set(_html_tags(card)) <= {"h1", "h2", "h3", "p", "a", "code", "pre", "strong", "ul", "li", "table",
                                     "thead", "tbody", "tr", "th", "td"}, sorted(set(_html_tags(card)))  # fmt: skip
    assert "``evil`<img src=x onerror=alert(1)>`---.jsonl``" in card  # verbatim, in a longer code span
    assert "| `batch_ratio_scope` | `` `<script>alert(2)</script>` `` |" in card


def _quick_start_code(card: str) -> str:
    (code,) = re.findall(r"## Quick start\n\n```python\n(.*?)```", card, re.DOTALL)
    return code


@pytest.mark.parametrize("folder", ['run "quoted"', "run\nnewline", "back\\slash 'single'"])
def test_quick_start_is_valid_python_for_any_output_path(untrained, tmp_path, folder):
    """A quote, a newline or a backslash in the output path stays inside a Python string literal of that path."""
    import ast

    output_dir = tmp_path / folder
    code = _quick_start_code(render_model_card(untrained, output_dir=output_dir, question='say "hi"\n'))
    calls = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)]
    (model,) = [ast.literal_eval(k.value) for call in calls for k in call.keywords if k.arg == "model"]
    assert model == str(output_dir)
    assert 'question = "say \\"hi\\"\\n"' in code


def test_adapter_on_the_embedded_policy_records_a_portable_base(tmp_path, monkeypatch):
    """PEFT records the embedded policy by its absolute path in this installation; `portable_adapter_config`
    records `EMBEDDED_POLICY_REFERENCE`, and the adapter loads after it moved, as its card says (and, from the folder
    that holds `trl_groupopt/`, through PEFT's `AutoPeftModelForCausalLM` too)."""
    import shutil

    import torch
    from peft import AutoPeftModelForCausalLM, LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    import trl_groupopt
    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH, load_embedded_policy
    from trl_groupopt.trainer.card import EMBEDDED_POLICY_REFERENCE, portable_adapter_config

    model = get_peft_model(
        load_embedded_policy()[0], LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    )
    model.save_pretrained(tmp_path / "saved")
    config_path = tmp_path / "saved" / "adapter_config.json"
    assert os.path.isabs(json.loads(config_path.read_text())["base_model_name_or_path"])  # what PEFT writes
    assert portable_adapter_config(tmp_path / "saved") and not portable_adapter_config(tmp_path / "saved")
    config = json.loads(config_path.read_text())
    assert config["base_model_name_or_path"] == EMBEDDED_POLICY_REFERENCE and str(ROOT) not in config_path.read_text()
    moved = shutil.move(tmp_path / "saved", tmp_path / "elsewhere" / "adapter")
    monkeypatch.chdir(tmp_path)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(EMBEDDED_POLICY_PATH), moved)
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in loaded.named_parameters() if "lora_" in n)
    monkeypatch.chdir(Path(trl_groupopt.__file__).parents[1])
    auto = AutoPeftModelForCausalLM.from_pretrained(moved)
    assert all(torch.equal(p, trained[n]) for n, p in auto.named_parameters() if "lora_" in n)
    assert not portable_adapter_config(tmp_path)  # no adapter there: nothing to do


def test_a_saved_adapter_reloads_with_auto_peft_from_any_working_directory(tmp_path, monkeypatch):
    """Issue 46, friction: a LoRA adapter saved by a run (no push) reloaded with
    `AutoPeftModelForCausalLM.from_pretrained(DIR)` only from the folder that holds `trl_groupopt/`: its
    `adapter_config.json` named the base by the relative `EMBEDDED_POLICY_REFERENCE`. A local save keeps PEFT's
    absolute path; what a push uploads names it portably (tests/hub/test_push.py)."""
    import torch
    from peft import AutoPeftModelForCausalLM, LoraConfig

    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

    args = ECHOConfig(**cpu_config_kwargs(tmp_path / "run", num_generations=2, steps_per_generation=1))
    trainer = ECHOTrainer(EMBEDDED_POLICY_PATH, length_reward, args=args, train_dataset=tiny_dataset(8),
                          peft_config=LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))  # fmt: skip
    trainer.save_model(str(tmp_path / "adapter"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter"))
    trained = dict(trainer.model.named_parameters())
    lora = [(n, p) for n, p in loaded.named_parameters() if "lora_" in n]
    assert lora and all(torch.equal(p, trained[n].detach()) for n, p in lora)
