"""A method in one function (issue 50): `register_objective` on a user's module outside `trl_groupopt/`
(`tests/user_objective/sapo_like.py`) gives the method, its generated classes, its CLI options and its loss through
the shared path; `register_estimator` gives an advantage estimator every method config selects; a package's entry
point registers without `--import`; `--import` reaches `train` and `compare`'s runs. In this process, nothing trains
(the trainings are in tests/e2e/test_user_objective.py)."""

from __future__ import annotations

import importlib
import pickle
import sys
import warnings

import pytest
import torch

import trl_groupopt
from tests.environment import REPO_ROOT
from tests.helpers import compute_loss_and_grads, inputs_with_policies, method_trainer, random_batch, tiny_model
from trl_groupopt import METHODS, Paper, register_estimator, register_objective
from trl_groupopt.cli import main as cli
from trl_groupopt.core.estimators import ESTIMATORS
from trl_groupopt.methods.functional import FUNCTION_OBJECTIVES, class_prefix
from trl_groupopt.methods.registry import ENTRY_POINT_GROUP, load_entry_points, unregister_method

USER_FOLDER = REPO_ROOT / "tests" / "user_objective"


def _forget(*names: str) -> None:
    for name in names:
        if name in METHODS:
            unregister_method(name)
        FUNCTION_OBJECTIVES.pop(name, None)


@pytest.fixture
def sapo_like():
    """The user's module imported from its own folder (not a package of this repository), undone afterwards."""
    sys.path.insert(0, str(USER_FOLDER))
    try:
        yield importlib.import_module("sapo_like")
    finally:
        sys.path.remove(str(USER_FOLDER))
        sys.modules.pop("sapo_like", None)
        _forget("sapo_like")


def test_the_decorator_gives_the_method_and_its_classes(sapo_like):
    spec = METHODS["sapo_like"]
    assert spec.summary == "soft gate instead of a clip" and spec.on_policy_equals is None  # its value is 2/tau * A
    trainer_class, config_class = trl_groupopt.trainer_class("sapo_like"), trl_groupopt.config_class("sapo_like")
    assert (trainer_class.__name__, config_class.__name__) == ("SAPOLikeTrainer", "SAPOLikeConfig")
    assert trl_groupopt.SAPOLikeTrainer is trainer_class and trainer_class.config_class is config_class
    assert spec.trainer_class is trainer_class and trainer_class.has_own_objective
    assert trainer_class._name == "SAPO_LIKE" and "sapo_like" in trainer_class._tag_names  # the card's, from the spec
    config = config_class("out", tau_pos=2.0)
    assert (config.tau_pos, config.tau_neg, config.advantage_estimator) == (2.0, 1.05, "grpo")
    assert pickle.loads(pickle.dumps(config)).tau_pos == 2.0  # checkpoints pickle it: found by import path
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"SAPOLikeConfig: tau_neg must be a finite number for 'sapo_like'"):
            config_class("out", tau_neg=value)
    assert sapo_like.sapo_like.__name__ == "sapo_like"  # the decorator returns the function unchanged


def test_knobs_are_cli_options(sapo_like, monkeypatch, capsys):
    _, args, _, _ = cli.parse("sapo_like", ["--tau_pos", "1.5", "--max_steps", "1"])
    assert type(args).__name__ == "SAPOLikeConfig" and (args.tau_pos, args.tau_neg, args.max_steps) == (1.5, 1.05, 1)
    calls = []
    monkeypatch.setattr(cli, "train", lambda method, argv, **kwargs: calls.append((method, argv)))
    cli.main(["train", "--method", "sapo_like", "--tau_neg", "2"])
    assert calls == [("sapo_like", ["--tau_neg", "2"])]
    cli.main(["methods"])
    assert "sapo_like  SAPOLikeTrainer: soft gate instead of a clip" in capsys.readouterr().out


def test_the_trainer_runs_the_function_through_the_shared_loss_path(sapo_like, tokenizer, tmp_path):
    """The trained loss is the function's, token-mean aggregated (dapo): checked against the function on the same
    log-probs; it returns no metric, and only the shared ones (entropy) are logged."""
    trainer = method_trainer("sapo_like", tmp_path, tiny_model(tokenizer, seed=3), tokenizer, loss_type="dapo",
                             tau_pos=0.5, tau_neg=3.0)  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = inputs_with_policies(trainer, random_batch(tokenizer, batch_size=4, seed=1, with_ref=False))
    loss, grads, metrics = compute_loss_and_grads(trainer, inputs)
    with torch.no_grad():
        batch = trainer.loss_inputs(trainer.model, inputs)
        logps, old, advantages, mask = batch.objective_args
        expected = sapo_like.sapo_like(logps, old, advantages, mask, tau_pos=0.5, tau_neg=3.0)
        expected = (expected * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected)
    assert grads and not any(key.startswith("clip_ratio") for key in metrics) and "entropy" in metrics


def test_a_group_objective_gets_groups_and_whole_groups(tokenizer, tmp_path):
    seen = []

    @register_objective("grouped_toy", knobs={"scale": 2}, needs_whole_groups=True, paper=Paper("A title", "@misc{}"))
    def grouped_toy(per_token_logps, old_per_token_logps, advantages, mask, *, groups, scale):
        seen.append((groups.num_groups, groups.size, scale))
        centred = per_token_logps - groups.rows(per_token_logps.mean(-1, keepdim=True), "mean")  # (B, T)
        return -scale * advantages.unsqueeze(-1) * centred

    try:
        trainer_class = trl_groupopt.trainer_class("grouped_toy")
        assert trainer_class.__name__ == "GROUPEDToyTrainer" and trainer_class.requires_whole_groups
        with pytest.raises(ValueError, match="needs whole groups in every micro-batch"):
            method_trainer("grouped_toy", tmp_path, tiny_model(tokenizer), tokenizer, per_device_train_batch_size=2,
                           num_generations=4, generation_batch_size=8)  # fmt: skip
        trainer = method_trainer("grouped_toy", tmp_path, tiny_model(tokenizer), tokenizer, scale=3)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        compute_loss_and_grads(trainer, inputs_with_policies(trainer, random_batch(tokenizer, group_size=4)))
        assert seen == [(1, 4, 3)]
    finally:
        _forget("grouped_toy")


def test_registration_errors_name_the_fix():
    def loss(per_token_logps, old_per_token_logps, advantages, mask, *, tau):
        return per_token_logps

    with pytest.raises(TypeError, match=r"has no parameter for the knob\(s\) \['other'\]"):
        register_objective("bad_toy", knobs={"tau": 1.0, "other": 2.0})(loss)
    with pytest.raises(TypeError, match=r"takes \['tau'\], which are neither knobs"):
        register_objective("bad_toy")(loss)
    with pytest.raises(
        ValueError, match=r"tau must be a finite number for 'bad_toy', got 'x' \(register it with check"
    ):
        register_objective("bad_toy", knobs={"tau": "x"})(loss)
    with pytest.raises(ValueError, match="A method named 'ctpo' is already registered"):
        register_objective("ctpo", knobs={"tau": 1.0})(loss)
    with pytest.raises(ValueError, match="lower-case identifiers"):
        register_objective("Bad", knobs={"tau": 1.0})(loss)
    assert "bad_toy" not in METHODS and "bad_toy" not in FUNCTION_OBJECTIVES and "Bad" not in METHODS

    def strict(tau):
        if tau not in ("soft", "hard"):
            raise ValueError(f"tau must be 'soft' or 'hard', got {tau!r}")

    register_objective("checked_toy", knobs={"tau": "soft"}, check=strict, on_policy_equals="grpo")(loss)
    try:  # a check accepts other values
        assert METHODS["checked_toy"].on_policy_equals == "grpo"  # the contract reads the claim from the spec
        config_class = trl_groupopt.config_class("checked_toy")
        assert config_class("out").tau == "soft" and config_class("out", tau="hard").tau == "hard"
        with pytest.raises(ValueError, match="CHECKEDToyConfig: tau must be 'soft' or 'hard', got 'no'"):
            config_class("out", tau="no")
    finally:
        _forget("checked_toy")


def test_class_names_of_multi_word_methods():
    assert [class_prefix(n) for n in ("sapo_like", "grpo_fix", "ctpo", "my_new_po")] == [
        "SAPOLike", "GRPOFix", "CTPO", "MYNewPo"]  # fmt: skip


def test_a_function_estimator_is_selectable_by_every_method_config(sapo_like, tokenizer, tmp_path):
    """A knob-less leave-one-out estimator of the raw rewards: the advantages the objective receives are the
    function's, with the CTPO and the user's objective alike; knobs after the configs exist are refused."""

    @register_estimator("loo_toy", summary="reward minus the mean of the others in its group")
    def loo_toy(rewards, groups):
        total = groups.rows(rewards, "sum")  # (B,)
        return rewards - (total - rewards) / (groups.size - 1)  # (B,)

    try:
        rewards = torch.tensor([1.0, 0.0, 0.0, 3.0])
        for method in ("ctpo", "sapo_like"):
            trainer = method_trainer(method, tmp_path / method, tiny_model(tokenizer), tokenizer,
                                     advantage_estimator="loo_toy")  # fmt: skip
            assert trainer.estimator.name == "loo_toy" and trainer.whole_groups  # it reads groups
            inputs = {"completion_mask": torch.ones(4, 3), "rewards": rewards, "advantages": torch.zeros(4)}
            got = trainer.compute_advantages(inputs, torch.zeros(4, 3), torch.ones(4, 3))
            torch.testing.assert_close(got, torch.tensor([0.0, -4 / 3, -4 / 3, 8 / 3]))
        with pytest.raises(RuntimeError, match=r"register estimator 'late_toy' before importing trl_groupopt's"):
            register_estimator("late_toy", knobs={"late_toy_k": 1.0})(lambda rewards, *, late_toy_k: rewards)
        with pytest.raises(
            ValueError, match=r"estimator 'late_toy': name its knobs late_toy_\.\.\. .* got \['beta'\]"
        ):
            register_estimator("late_toy", knobs={"beta": 1.0})(lambda rewards, *, beta: rewards)
        assert "late_toy" not in ESTIMATORS
    finally:
        ESTIMATORS.unregister("loo_toy")


def test_import_option_reaches_train_and_compare(sapo_like, monkeypatch, capsys):
    """`--import` is taken out of train's options (the module imported before the parser lists the methods) and
    handed on to compare's runs as a train option; a module that is not there is one line."""
    assert cli.take_imports(["--import", "a", "--x", "1", "--import=b"]) == (["--x", "1"], ["a", "b"])
    calls = []
    monkeypatch.setattr(cli, "train", lambda method, argv, **kwargs: calls.append((method, argv)))
    cli.main(["train", "--import", "sapo_like", "--method", "sapo_like", "--max_steps", "2"])
    assert calls == [("sapo_like", ["--max_steps", "2"])]
    monkeypatch.setattr(cli, "train", lambda method, argv, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(SystemExit):  # Ctrl-C: the command it prints to run again keeps the import
        cli.main(["train", "--import", "sapo_like", "--method", "sapo_like", "--max_steps", "2"])
    assert "trl-groupopt train --method sapo_like --import sapo_like --max_steps 2" in capsys.readouterr().err
    driver = importlib.import_module("trl_groupopt.comparison.driver")
    monkeypatch.setattr(driver, "main", lambda argv: calls.append(argv) or 0)
    with pytest.raises(SystemExit):
        cli.main(["compare", "--methods", "grpo,sapo_like", "--import", "sapo_like", "--output_dir", "o"])
    options = importlib.import_module("trl_groupopt.comparison.options").parse_options(calls[-1])
    assert options.methods == ["grpo", "sapo_like"] and options.train_args[-2:] == ["--import", "sapo_like"]
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", "--import", "no_such_module_here", "--method", "grpo"])
    assert stop.value.code == 2
    assert "error: --import no_such_module_here: No module named 'no_such_module_here'" in capsys.readouterr().err


def _installed_package(site, value: str) -> None:
    """A package installed into `site` as pip lays one out: its module beside a `.dist-info` holding the METADATA
    and the `entry_points.txt` that declares `value` in the group `trl_groupopt.methods`."""
    info = site / "sapo_like_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "sapo_like.py").write_text((USER_FOLDER / "sapo_like.py").read_text())
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sapo-like-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nsapo_like = {value}\n")


def test_an_entry_point_registers_without_import(tmp_path):
    """importlib.metadata's own machinery over a `.dist-info` on `sys.path` (what an installed package is); the
    registry's `load_entry_points` imports the module named there. A broken entry point warns and is skipped."""
    for folder, value in (("site", "sapo_like"), ("broken", "no_such_module_of_the_plugin")):
        _installed_package(tmp_path / folder, value)
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        assert "sapo_like" not in METHODS
        load_entry_points()
        assert trl_groupopt.trainer_class("sapo_like").__name__ == "SAPOLikeTrainer"
    finally:
        sys.path.remove(str(tmp_path / "site"))
        sys.modules.pop("sapo_like", None)
        _forget("sapo_like")
    sys.path.insert(0, str(tmp_path / "broken"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_entry_points()
    finally:
        sys.path.remove(str(tmp_path / "broken"))
    assert "sapo_like" not in METHODS
    assert any("no_such_module_of_the_plugin failed to load and is skipped" in str(w.message) for w in caught)
