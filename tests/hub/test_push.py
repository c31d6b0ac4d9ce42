"""Push to the Hub, end to end, against the local Hub server of `tests/hub/server.py` (no network, CPU).

Every registered method's trainer (the base `GroupOptTrainer` included) trains the embedded policy for 2 steps with
`push_to_hub=True` and calls `trainer.push_to_hub(...)`; OTB once more with `hub_strategy="every_save"`
(a push per checkpoint); the demo script (`trl_groupopt.cli.main.train` with `--push_to_hub --hub_model_id`); and a LoRA
run that pushes its adapter. The assertions read only what the server received:

- the weights (or the adapter), the config, the tokenizer and its chat template, byte for byte what was trained;
- `README.md` is trl-groupopt's card for that trainer (method, knobs, BibTeX, reward summary) with honest metadata:
  no `base_model` (the embedded policy is not on the Hub), `library_name` (`peft` for the adapter), the tags;
- no token in any version of any uploaded file (the pickled `training_args.bin` included, read as bytes);
- the repo reloads with `from_pretrained` from the server's storage and generates (the card's own quick start is run).

The trainer runs are shared between the assertions (one run per method and module, on first use).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback
from trl import GRPOConfig

from tests.helpers import assert_registered, cpu_config_kwargs, length_reward, tiny_dataset
from tests.hub.conftest import FAKE_TOKEN
from tests.selection import tested_methods
from trl_groupopt import (
    DFPOTrainer,
    ECHOConfig,
    ECHOTrainer,
    OTBConfig,
    OTBTrainer,
    get_method,
)
from trl_groupopt.data.offline import load_embedded_policy
from trl_groupopt.trainer.card import (
    ARITHMETIC_QUESTION,
    EMBEDDED_POLICY_REFERENCE,
    SYNTHETIC_DATASET_NAME,
    render_model_card,
)

pytestmark = pytest.mark.slow

#: registry name -> one exact knob row (value formatted) the card must show, on top of the generic check (a row for
#: every field of the method's own config, `check_own_knobs`); a method without an entry gets the generic check only.
CARD_ROWS = {
    "echo": "| `batch_epsilon` | `0.2` | (method-specific) |",
    "dfpo": "| `dfpo_transform` | `min_replace` | (method-specific) |",
    "grpo_fix": "| `dfpo_transform` | `symmetric_clip` | (method-specific) |",
    "ctpo": "| `ctpo_dual_clip` | `0.05` | (method-specific) |",
    "otb": "| `otb_token_positions` | `valid` | (method-specific) |",
    "grpo": "| `max_completion_length` | `8` | `512` |",
}
TOKEN_SHAPED = re.compile(rb"hf_[A-Za-z0-9]{30,}")
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors"}
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors"}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


# ------------------------------------------------------------------------------------------------ the runs
@pytest.fixture(scope="module")
def policy():
    return load_embedded_policy()


def _config(config_cls, output_dir: Path, repo_id: str, **overrides):
    # Every config, TRL's plain GRPOConfig included, keeps `hub_token` out of the pickled `training_args.bin`.
    kwargs = cpu_config_kwargs(output_dir, num_generations=2, max_steps=2, push_to_hub=True, hub_model_id=repo_id,
                               disable_tqdm=True, hub_token=FAKE_TOKEN, **overrides)  # fmt: skip
    return config_cls(**kwargs)


def character_reward(completions, **kwargs) -> list[float]:
    """A reward that differs within a group although every completion is cut at `max_completion_length` (8 tokens
    here): `length_reward` would give each group one reward, so no signal and, rightly, no update (issue 29)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(map(ord, t)) % 97 / 97.0 for t in texts]


class WaitForPush(TrainerCallback):
    """Wait for each checkpoint's background upload before training on. transformers uploads a checkpoint from the
    output folder while training continues, skips a save whose predecessor is still uploading, and may upload a file
    that the next save is rewriting: with this wait every save is pushed, whole, as a user with a slower step sees."""

    trainer = None  # set once the trainer exists

    def on_save(self, args, state, control, **kwargs):
        self.trainer._finish_current_push()


class Runs:
    """One trained-and-pushed run per key, made on first use and shared by the module's tests."""

    def __init__(self, hub, policy, root: Path):
        self.hub, self.policy, self.root, self.cache = hub, policy, root, {}

    def get(self, key: str) -> dict:
        if key not in self.cache:
            self.cache[key] = getattr(self, "_" + key.split(":")[0])(key)
        return self.cache[key]

    def _trainer(self, config_cls, trainer_cls, args, reward=length_reward, **kwargs):
        model, tokenizer = self.policy
        return trainer_cls(copy.deepcopy(model), reward, args=args, train_dataset=tiny_dataset(32),
                           processing_class=tokenizer, **kwargs)  # fmt: skip

    def _method(self, key: str) -> dict:
        """`method:<name>`: 2 steps, then `trainer.push_to_hub(dataset_name=...)` as the demo does."""
        name = key.split(":")[1]
        spec = get_method(name)
        repo_id = f"test-user/{name.replace('_', '-')}-run"
        args = _config(spec.config_class, self.root / name, repo_id)
        trainer = self._trainer(spec.config_class, spec.trainer_class, args)
        trainer.train()
        trainer.push_to_hub(dataset_name=SYNTHETIC_DATASET_NAME)
        return {"trainer": trainer, "repo_id": repo_id, "dataset_name": SYNTHETIC_DATASET_NAME}

    def _every_save(self, key: str) -> dict:
        """OTB with `hub_strategy="every_save"`: each checkpoint is pushed as it is saved (no final push)."""
        repo_id = "test-user/otb-every-save"
        args = _config(OTBConfig, self.root / "every-save", repo_id, save_strategy="steps", save_steps=1,
                       hub_strategy="every_save", hub_always_push=True)  # fmt: skip
        wait = WaitForPush()
        trainer = self._trainer(OTBConfig, OTBTrainer, args, reward=character_reward, callbacks=[wait])
        wait.trainer = trainer
        trainer.train()
        trainer._finish_current_push()  # the checkpoint pushes run in the background
        return {"trainer": trainer, "repo_id": repo_id, "dataset_name": None}

    def _lora(self, key: str) -> dict:
        """ECHO with a LoRA adapter: `save_model` (PEFT writes its README there), then `push_to_hub`."""
        from peft import LoraConfig

        repo_id = "test-user/echo-lora"
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        trainer = self._trainer(ECHOConfig, ECHOTrainer, _config(ECHOConfig, self.root / "lora", repo_id),
                                peft_config=peft_config)  # fmt: skip
        trainer.train()
        trainer.save_model()
        saved_card = (Path(trainer.args.output_dir) / "README.md").read_text(encoding="utf-8")
        trainer.push_to_hub(dataset_name=SYNTHETIC_DATASET_NAME)
        return {"trainer": trainer, "repo_id": repo_id, "dataset_name": SYNTHETIC_DATASET_NAME,
                "saved_card": saved_card}  # fmt: skip

    def _demo(self, key: str) -> dict:
        """The demo script, as `python examples/train_dfpo.py --push_to_hub --hub_model_id ...` runs it."""
        from trl_groupopt.cli.main import train

        repo_id = "test-user/dfpo-demo"
        argv = ["--output_dir", str(self.root / "demo"), "--push_to_hub", "--hub_model_id", repo_id,
                "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2",
                "--gradient_accumulation_steps", "1", "--steps_per_generation", "2", "--max_completion_length", "8",
                "--num_train_examples", "16", "--evaluate_accuracy", "false", "--logging_steps", "1"]  # fmt: skip
        trainer = train("dfpo", argv)
        return {"trainer": trainer, "repo_id": repo_id, "dataset_name": SYNTHETIC_DATASET_NAME}


@pytest.fixture(scope="module")
def runs(hub, policy, tmp_path_factory):
    return Runs(hub, policy, tmp_path_factory.mktemp("push-runs"))


# ------------------------------------------------------------------------------------------------ checks
def _front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, re.DOTALL)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def _quick_start(card: str) -> str:
    (code,) = re.findall(r"## Quick start\n\n```python\n(.*?)```", card, re.DOTALL)
    return code


def check_no_token(hub) -> None:
    """No version of any uploaded file holds the token or anything token-shaped (the pickled args included)."""
    uploaded = hub.uploaded()
    assert any("training_args.bin" in name for name in uploaded)  # the pickle is among what was scanned
    leaking = sorted(name for name, content in uploaded.items()
                     if FAKE_TOKEN.encode() in content or TOKEN_SHAPED.search(content))  # fmt: skip
    assert not leaking, leaking


def check_card(run: dict, card: str, knob_row: str | None) -> None:
    """`README.md` is our card for this trainer, with honest metadata and no hole."""
    trainer = run["trainer"]
    assert card == render_model_card(trainer, dataset_name=run["dataset_name"])  # exactly what our hook renders
    meta = _front_matter(card)
    adapter = run.get("adapter", False)
    assert meta["library_name"] == ("peft" if adapter else "transformers")
    assert "base_model" not in meta  # the embedded policy has no Hub id: no metadata rather than a local path
    assert "datasets" not in meta  # the synthetic task is not a Hub dataset
    assert {"generated_from_trainer", "trl", "trl-groupopt", *trainer._tag_names} <= set(meta["tags"])
    assert meta["model_name"] == run["repo_id"].split("/")[1] and meta["pipeline_tag"] == "text-generation"
    assert f"trained with **{trainer._name}** (`{type(trainer).__name__}`)" in card
    assert "embedded tiny policy (`trl_groupopt/assets/tiny_policy`" in card
    if knob_row:
        assert knob_row in card
    logged = [(entry["step"], entry["reward"]) for entry in trainer.state.log_history if "reward" in entry]
    assert len(logged) <= 10  # each 10% end of the summary is one logged step
    (first_step, first), (last_step, last) = logged[0], logged[-1]
    assert f"| `reward` | {first:.4g} (step {first_step}) | {last:.4g} (step {last_step}) |" in card
    assert f"Optimizer steps: {trainer.state.global_step};" in card
    assert trainer._paper["citation"].strip() in card and "@software{vonwerra2020trl," in card
    question = ARITHMETIC_QUESTION[0]
    assert f"question = {json.dumps(question)}" in _quick_start(card)
    assert "huggingface.co/None" not in card and "datasets/synthetic-arithmetic" not in card
    if trainer.args.steps_per_generation == trainer.args.gradient_accumulation_steps:  # not set: TRL derived it
        assert "| `steps_per_generation` |" not in card
    assert not re.search(r"\{\{ *\w+ *\}\}|\{%", card)  # no unrendered template syntax
    assert "None" not in card.split("## Training procedure")[0]


def check_model(hub, repo_id: str, trainer) -> None:
    """Weights, config, tokenizer and chat template arrived, reload from the server's storage and generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = hub.files(repo_id)
    assert MODEL_FILES | TOKENIZER_FILES | {"README.md", "training_args.bin"} <= files.keys(), sorted(files)
    model = AutoModelForCausalLM.from_pretrained(hub.repo_dir(repo_id))
    trained = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained[name]), name  # the trained weights, not the initial ones
    tokenizer = AutoTokenizer.from_pretrained(hub.repo_dir(repo_id))
    messages = [{"role": "user", "content": ARITHMETIC_QUESTION[0]}]
    original = trainer.processing_class
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == original.apply_chat_template(
        messages, add_generation_prompt=True
    )
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)  # fmt: skip
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def run_quick_start(hub, card: str, repo_id: str) -> str:
    """Execute the card's quick start with the repo id pointed at the server's storage; returns the generation."""
    code = _quick_start(card).replace(f'"{repo_id}"', repr(str(hub.repo_dir(repo_id))))
    assert str(hub.repo_dir(repo_id)) in code
    assert 'print(output["generated_text"])' in code
    code = re.sub(r"max_new_tokens=\d+", "max_new_tokens=4", code)
    code = code.replace('print(output["generated_text"])', 'result = output["generated_text"]')
    namespace: dict = {}
    exec(compile(code, "quick_start", "exec"), namespace)  # noqa: S102 - our own card's snippet
    return namespace["result"]


# ------------------------------------------------------------------------------------------------ the tests
def test_card_rows_name_registered_methods():
    assert_registered(CARD_ROWS, "CARD_ROWS")


def check_own_knobs(trainer, card: str) -> None:
    """Every field of the method's own config (not GRPOConfig's) has its row, with its value."""
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    knobs = [
        f.name for f in dataclasses.fields(trainer.args) if f.name not in grpo_fields and not f.name.startswith("_")
    ]
    for knob in knobs:
        assert re.search(rf"\n\| `{knob}` \| `[^`\n]+` \| \(method-specific\) \|\n", card), knob


@pytest.mark.parametrize("name", tested_methods())
def test_method_trainer_push(name, runs, hub):
    run = runs.get(f"method:{name}")
    repo_id, trainer = run["repo_id"], run["trainer"]
    assert trainer.hub_model_id == repo_id
    (commit,) = hub.repos[repo_id].commits  # push_to_hub with the default hub_strategy: one commit, at the end
    assert commit.summary == "End of training"
    assert not any(path.startswith("checkpoint-") for path in hub.files(repo_id))
    card = hub.files(repo_id)["README.md"].decode()
    check_card(run, card, CARD_ROWS.get(name))
    check_own_knobs(trainer, card)
    check_model(hub, repo_id, trainer)
    check_no_token(hub)
    assert not hub.errors, hub.errors


def test_every_save_pushes_each_checkpoint(runs, hub):
    run = runs.get("every_save")
    repo_id, trainer = run["repo_id"], run["trainer"]
    commits = hub.repos[repo_id].commits
    assert [c.summary for c in commits] == ["Training in progress, step 1", "Training in progress, step 2"]
    # the first push carries everything; later ones what changed (the server reports stored oids, as the Hub does)
    assert MODEL_FILES | TOKENIZER_FILES | {"README.md", "training_args.bin"} <= commits[0].files.keys()
    assert "model.safetensors" in commits[1].files
    # transformers uploads each checkpoint in the background from the output folder: when the next step's card is
    # written before the previous upload reads it, that upload already carries it and the next skips it as unchanged.
    if "README.md" not in commits[1].files:
        assert "Optimizer steps: 2;" in commits[0].files["README.md"].decode()
    assert commits[0].files["model.safetensors"] != commits[1].files["model.safetensors"]
    for commit in commits:  # the card of that moment
        assert "Optimizer steps: " in commit.files["README.md"].decode()
    card = hub.files(repo_id)["README.md"].decode()
    assert "| `otb_token_positions` | `valid` |" in card and "Optimizer steps: 2;" in card
    assert not any(path.startswith("checkpoint-") for path in hub.files(repo_id))  # hub_strategy every_save only
    check_model(hub, repo_id, trainer)
    check_no_token(hub)
    assert not hub.errors, hub.errors


def test_demo_script_push(runs, hub):
    run = runs.get("demo")
    repo_id, trainer = run["repo_id"], run["trainer"]
    assert isinstance(trainer, DFPOTrainer) and hub.repos[repo_id].commits[-1].summary == "End of training"
    card = hub.files(repo_id)["README.md"].decode()
    check_card(run, card, "| `dfpo_transform` | `min_replace` | (method-specific) |")
    assert "| `steps_per_generation` | `2` | `1` |" in card  # set on the command line: listed
    check_model(hub, repo_id, trainer)
    assert isinstance(run_quick_start(hub, card, repo_id), str)
    check_no_token(hub)
    assert not hub.errors, hub.errors


def test_lora_run_pushes_the_adapter_with_our_card(runs, hub, policy):
    from peft import PeftModel

    run = runs.get("lora")
    run["adapter"] = True
    repo_id, trainer = run["repo_id"], run["trainer"]
    files = hub.files(repo_id)
    assert ADAPTER_FILES | TOKENIZER_FILES | {"README.md"} <= files.keys(), sorted(files)
    assert "model.safetensors" not in files  # the adapter, not full weights
    # the embedded policy recorded by its portable name, not by its path in this checkout (saved and pushed)
    saved = Path(trainer.args.output_dir, "adapter_config.json").read_text(encoding="utf-8")
    for config in (json.loads(files["adapter_config.json"]), json.loads(saved)):
        assert config["base_model_name_or_path"] == EMBEDDED_POLICY_REFERENCE, config["base_model_name_or_path"]
    card = files["README.md"].decode()
    check_card(run, card, "| `batch_epsilon` | `0.2` | (method-specific) |")
    assert "This repository holds a PEFT adapter (LoraConfig, r=4)" in card and "- PEFT: " in card
    assert {"peft", "lora"} <= set(_front_matter(card)["tags"])
    # `save_model` alone left our card in the output folder too, not PEFT's empty template
    assert "### Method configuration" in run["saved_card"] and "[More Information Needed]" not in run["saved_card"]
    base, _ = policy
    model = PeftModel.from_pretrained(copy.deepcopy(base), hub.repo_dir(repo_id))
    trained = {n: p for n, p in trainer.model.named_parameters() if "lora_" in n}
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert trained.keys() == loaded.keys() and all(torch.equal(trained[n], loaded[n]) for n in trained)
    # the base from EMBEDDED_POLICY_PATH plus the pushed adapter
    assert isinstance(run_quick_start(hub, card, repo_id), str)
    check_no_token(hub)
    assert not hub.errors, hub.errors
