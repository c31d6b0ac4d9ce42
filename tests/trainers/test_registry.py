"""The registry of methods (`trl_groupopt.METHODS`): its contract, and the toy method of docs/adding-a-method.md,
which reaches the CLI and passes the same generic trainer tests as the built-in methods.

The toy's four files are the doc's code blocks, written as they are to the paths they name under a temporary folder
that `trl_groupopt.methods` also searches (its `__path__`); the registry's own discovery
(`trl_groupopt.methods.registry.discover`) then finds its spec. The generic tests are the functions of
tests/trainers/test_validation.py, tests/hub/test_model_card.py and tests/e2e/ that are parametrised over the registry,
called here with the toy's name. The two checks that train are marked `slow`. (The doc's procedure itself, a shipped
method's folder copied under a new name, is run by tests/test_new_method_folder.py.)
"""

from __future__ import annotations

import importlib
import re
import sys

import pytest
import torch

from tests.e2e import test_method_training, test_model_card_training
from tests.environment import REPO_ROOT
from tests.helpers import (
    BUILT_IN_METHODS,
    compute_loss_and_grads,
    inputs_with_policies,
    method_config,
    method_trainer,
    random_batch,
    tiny_model,
    tiny_tokenizer,
)
from tests.hub import test_model_card
from tests.trainers import test_validation
from trl_groupopt import METHODS, ECHOConfig, ECHOTrainer, get_method, register_method
from trl_groupopt.cli import main as cli
from trl_groupopt.core.common import ObjectiveFn
from trl_groupopt.methods import registry as methods
from trl_groupopt.methods.registry import unregister_method

DOC = REPO_ROOT / "docs" / "adding-a-method.md"
TOY_FILES = tuple(f"trl_groupopt/methods/toy/{name}.py" for name in ("__init__", "objective", "trainer", "spec"))


def doc_code_files() -> dict[str, str]:
    """The doc's code blocks that start with `# <path>`, by that path."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    return {block.splitlines()[0].removeprefix("# "): block for block in blocks if block.startswith("# trl_groupopt/")}


# ================================================================================================ the toy method
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The doc's four files, in a folder the package searches; the registry discovers the spec. Undone after this
    module's tests."""
    root = tmp_path_factory.mktemp("repo")
    files = doc_code_files()
    assert tuple(files) == TOY_FILES
    for path, code in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(code, encoding="utf-8")
    packages = [importlib.import_module("trl_groupopt.methods")]
    for package in packages:
        package.__path__.append(str(root / package.__name__.replace(".", "/")))
    try:
        new = [spec for spec in methods.discover() if spec.name not in METHODS]
        assert [spec.name for spec in new] == ["toy"]
        yield METHODS.register("toy", new[0])
    finally:
        for package in packages:
            package.__path__.remove(str(root / package.__name__.replace(".", "/")))
            for name in [m for m in sys.modules if m.startswith(f"{package.__name__}.toy")]:
                sys.modules.pop(name)
        if "toy" in METHODS:
            unregister_method("toy")
    assert "toy" not in METHODS


def test_the_toy_is_one_folder_and_the_doc_says_so(toy):
    """The folder's four files are the doc's code; the spec names the classes (exported from there), the trainer
    overrides only `objective`, and the method's name is written once (the mechanism's comes from the spec)."""
    trainer_class, config_class = toy.trainer_class, toy.config_class
    assert toy.exports == {
        "ToyTrainer": "trl_groupopt.methods.toy.trainer",
        "ToyConfig": "trl_groupopt.methods.toy.trainer",
    }
    own = {name for name in vars(trainer_class) if not name.startswith("__")} - {"has_own_objective"}  # derived
    assert own == {"config_class", "objective"}
    assert config_class is trainer_class.config_class and toy.mechanism.method == "toy"
    assert trainer_class._name == "TOY" and trainer_class._tag_names == ["trl", "toy", "trl-groupopt"]
    _: ObjectiveFn = importlib.import_module("trl_groupopt.methods.toy.objective").toy_loss  # the objective protocol
    text = DOC.read_text(encoding="utf-8")
    assert "A method is one folder, `trl_groupopt/methods/<m>/`" in text and all(
        f"`{path}`".replace("toy", "<m>") in text for path in TOY_FILES
    )
    assert toy.acting_settings == {} and toy.mechanism is not None  # the shared invariance tests read both


# ================================================================================================ the toy through the CLI
def test_toy_reaches_the_cli(toy, monkeypatch, capsys):
    assert METHODS["toy"] is toy is get_method("toy") and "toy" in cli.METHODS
    _, args, _, demo = cli.parse("toy", [])
    assert type(args) is toy.config_class and args.toy_advantage_scale == 2.0 and demo
    _, args, _, _ = cli.parse("toy", ["--toy_advantage_scale", "3", "--max_steps", "1"])
    assert (args.toy_advantage_scale, args.max_steps) == (3.0, 1)
    with pytest.raises(ValueError, match=r"toy_advantage_scale must be > 0, got -1\.0"):
        cli.parse("toy", ["--toy_advantage_scale", "-1"])

    calls = []
    monkeypatch.setattr(cli, "train", lambda method, argv, **kwargs: calls.append((method, argv)))  # kwargs: prog
    cli.main(["train", "--method", "toy", "--toy_advantage_scale", "3"])  # `trl-groupopt train --method toy ...`
    assert calls == [("toy", ["--toy_advantage_scale", "3"])]
    with pytest.raises(SystemExit):
        cli.main(["train", "--method", "not_a_method"])
    error = capsys.readouterr().err
    assert "invalid choice: 'not_a_method'" in error and "'toy'" in error  # the choices are read from the registry
    assert all(f"'{name}'" in error for name in BUILT_IN_METHODS)


# ================================================================================================ the toy, generic tests
def _two_steps(tmp_path, monkeypatch):
    tokenizer = tiny_tokenizer()
    test_method_training.test_two_step_training((tokenizer, tiny_model(tokenizer, seed=3), tmp_path), "toy")


def _loss_types(tmp_path, monkeypatch):
    for loss_type in ("cispo", "sapo", "vespo", "not_a_loss"):
        test_validation.test_surrogate_replacing_loss_types_rejected_by_every_trainer(tmp_path, "toy", loss_type)


def _model_card(tmp_path, monkeypatch):
    monkeypatch.setitem(test_model_card.CARD_KNOBS, "toy", "| `toy_advantage_scale` | `2` | (method-specific) |")
    tokenizer = tiny_tokenizer()
    test_model_card.test_model_card_metadata("toy")
    test_model_card_training.test_model_card_renders_method_knobs_rewards_and_citations(
        "toy", tokenizer, tiny_model(tokenizer, seed=5), tmp_path, monkeypatch
    )


GENERIC = {  # the generic trainer tests, each called with the toy's name
    "construct_and_train_two_steps": _two_steps,
    "rejects_surrogate_replacing_loss_types": _loss_types,
    "needs_its_own_config_class": lambda tmp, _: test_validation.test_trainer_needs_its_own_config_class(tmp, "toy"),
    "accepts_partial_groups": lambda tmp, _: test_validation.test_token_level_methods_accept_partial_groups(
        tmp, "toy"
    ),
    "honours_delta": lambda tmp, _: test_validation.test_delta_only_where_the_objective_has_a_two_sided_clip(
        tmp, "toy"
    ),
    "liger_and_unsloth_routing": lambda tmp, _: test_validation.test_liger_and_unsloth_routing_on_the_real_trainers(
        tmp, "toy"
    ),
    "model_card": _model_card,
}
#: the generic checks that run `trainer.train()` (end-to-end tests called for the toy): outside the fast selection
TRAINING_CHECKS = {"construct_and_train_two_steps", "model_card"}


@pytest.mark.parametrize(
    "check", [pytest.param(name, marks=pytest.mark.slow) if name in TRAINING_CHECKS else name for name in GENERIC]
)
def test_toy_passes_the_generic_trainer_tests(toy, check, tmp_path, monkeypatch):
    GENERIC[check](tmp_path, monkeypatch)


def test_toy_objective_is_the_one_trained(toy, tmp_path):
    """The toy's loss is the base's clipped surrogate times the scale (linear in A, scale 2 keeps every clip branch):
    the registered trainer runs the toy's objective, not the default."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3)
    batch = random_batch(tokenizer, batch_size=4, seed=1, with_ref=False)
    losses = {}
    for name in ("grpo", "toy"):
        trainer = method_trainer(name, tmp_path / name, model, tokenizer, loss_type="dapo")
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        losses[name], _, metrics = compute_loss_and_grads(trainer, inputs_with_policies(trainer, batch))
    torch.testing.assert_close(losses["toy"], 2 * losses["grpo"])
    assert metrics["toy/adv_abs_mean"][0] > 0


# ================================================================================================ the registry's contract
def test_built_in_methods_are_registered():
    assert BUILT_IN_METHODS <= set(METHODS)
    for name, spec in METHODS.items():
        assert spec.name == name and spec.paper and spec.headline_metric
        assert issubclass(spec.config_class, spec.trainer_class.config_class), name


def test_make_config_applies_a_modes_defaults_under_the_callers(tmp_path):
    assert method_config("grpo_fix", tmp_path).dfpo_transform == "symmetric_clip"
    assert method_config("grpo_fix", tmp_path, epsilon_high=0.05).epsilon_high == 0.05
    assert method_config("dfpo", tmp_path).dfpo_transform == "min_replace"


def test_duplicate_name_rejected(toy):
    before = METHODS["echo"]
    with pytest.raises(ValueError, match=r"A method named 'echo' is already registered \(by ECHOTrainer\)"):
        register_method("echo", config_class=toy.config_class, trainer_class=toy.trainer_class, paper="x",
                        headline_metric="y")  # fmt: skip
    assert METHODS["echo"] is before


def test_unknown_name_error_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"Unknown method 'nope'; registered methods: ") as error:
        get_method("nope")
    assert all(name in str(error.value) for name in METHODS)
    with pytest.raises(ValueError, match=r"Unknown method 'nope'"):
        cli.parse("nope", [])
    with pytest.raises(ValueError, match=r"Unknown method 'nope'"):
        unregister_method("nope")


def test_config_class_mismatch_rejected(toy):
    ToyConfig, ToyTrainer = toy.config_class, toy.trainer_class  # noqa: N806
    with pytest.raises(
        ValueError,
        match=r"ToyTrainer reads a ToyConfig, but method 'toy_mismatch' registers "
        r"config_class=ECHOConfig; register the trainer's own config class",
    ):
        register_method("toy_mismatch", config_class=ECHOConfig, trainer_class=ToyTrainer, paper="x",
                        headline_metric="y")  # fmt: skip
    with pytest.raises(ValueError, match=r"ECHOTrainer reads a ECHOConfig, but .* config_class=ToyConfig"):
        register_method("toy_mismatch", config_class=ToyConfig, trainer_class=ECHOTrainer, paper="x",
                        headline_metric="y")  # fmt: skip
    assert "toy_mismatch" not in METHODS


@pytest.mark.parametrize("name", ["Toy", "toy-method", "", "toy method"])
def test_names_are_cli_values(toy, name):
    with pytest.raises(ValueError, match="lower-case identifiers"):
        register_method(name, config_class=toy.config_class, trainer_class=toy.trainer_class, paper="x",
                        headline_metric="y")  # fmt: skip
    assert name not in METHODS


def test_methods_is_read_only():
    with pytest.raises(TypeError):
        METHODS["toy"] = METHODS["echo"]  # type: ignore[index]
