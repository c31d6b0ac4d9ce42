"""The first hour of a new user (issue 16), one test per item: help that shows every option, defaults that fit a CPU,
errors at the door for bad data and bad rewards, all-None rewards, and no empty folder after a failed run. The items
that train or launch a process (the README snippet on a CPU, the example script's help, what the demo leaves behind)
are in tests/e2e/test_first_hour.py."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
from datasets import Dataset

from trl_groupopt import METHODS, ECHOConfig, ECHOTrainer, OTBConfig
from trl_groupopt.cli import main as cli
from trl_groupopt.data import adapters, checks, offline
from trl_groupopt.data.offline import make_arithmetic_dataset
from trl_groupopt.data.rewards import accuracy_reward, format_reward


def _tiny_args(tmp_path, **kwargs) -> ECHOConfig:
    # one generation per step (ECHO defaults to 8 steps per rollout): these tests count generation batches
    settings = dict(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, num_generations=2,
                    max_completion_length=8, report_to="none", save_strategy="no", use_cpu=True,
                    disable_tqdm=True, logging_steps=1, steps_per_generation=1)  # fmt: skip
    settings.update(kwargs)
    return ECHOConfig(**settings)


# ------------------------------------------------------------------------------------------------ 2. --help
def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def test_method_help_lists_method_knobs_training_and_data_options(capsys):
    text = _help(["train", "--method", "otb", "--help"], capsys)
    for option in ("--otb_handle_zero_tail", "--max_steps", "--learning_rate", "--dataset_name", "--dataset_format",
                   "--model_name_or_path", "--use_peft", "--max_all_none_reward_batches"):  # fmt: skip
        assert option in text, option
    assert f"(default: {cli.EMBEDDED_POLICY_DEFAULTS['max_steps']} (embedded policy)" in " ".join(text.split())
    dfpo = _help(["train", "--method", "dfpo", "--help"], capsys)
    assert "--dfpo_transform" in dfpo
    echo = _help(["train", "--method", "echo", "--help"], capsys)
    assert "--batch_epsilon" in echo


def test_top_level_help_lists_subcommands_and_every_method(capsys):
    text = _help(["--help"], capsys)
    assert "train" in text and "methods" in text
    for name in METHODS:
        assert name in text, name
    text = _help(["train", "--help"], capsys)  # no method yet: the methods and how to get their options
    assert "--method" in text and all(name in text for name in METHODS)


# ------------------------------------------------------------------------------------------------ 3. defaults
def test_bf16_follows_the_device_unless_set(tmp_path):
    from trl_groupopt.trainer.device import device_supports_bf16

    assert ECHOConfig(str(tmp_path)).bf16 is device_supports_bf16(False)
    assert ECHOConfig(str(tmp_path), use_cpu=True).bf16 is False
    assert ECHOConfig(str(tmp_path), fp16=False, bf16=False).bf16 is False
    if not torch.cuda.is_available():  # the README snippet's situation: no GPU, nothing set, no error
        assert ECHOConfig(str(tmp_path)).bf16 is False


def test_config_construction_has_no_future_warning(tmp_path, recwarn):
    import warnings

    warnings.simplefilter("always")
    OTBConfig(str(tmp_path))
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)], [str(w.message) for w in recwarn]


def test_naming_a_model_keeps_the_run_defaults(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    _, args, model_args, demo = cli.parse("echo", ["--model_name_or_path", str(model_dir)])
    assert not demo and model_args.model_name_or_path == str(model_dir)
    for key, value in cli.RUN_DEFAULTS.items():
        if key != "report_to":  # normalised to [] by TrainingArguments
            assert getattr(args, key) == value, key
    assert args.output_dir == os.path.join("outputs", "echo-my-model")
    assert args.learning_rate != cli.EMBEDDED_POLICY_DEFAULTS["learning_rate"]  # the tiny policy's lr does not apply
    assert args.bf16 is (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    _, args, _, demo = cli.parse("echo", ["--learning_rate", "1e-3"])
    assert demo and args.learning_rate == 1e-3 and args.max_steps == cli.EMBEDDED_POLICY_DEFAULTS["max_steps"]
    _, args, _, _ = cli.parse("grpo_fix", [])  # a mode from the registry: its settings, then the demo's
    assert args.dfpo_transform == "symmetric_clip" and args.max_steps == cli.EMBEDDED_POLICY_DEFAULTS["max_steps"]


# ------------------------------------------------------------------------------------------------ 4. bad data
@pytest.fixture(scope="module")
def arithmetic():
    return make_arithmetic_dataset(8)


def test_missing_prompt_column_names_the_fix():
    data = Dataset.from_dict({"question": ["1+1?"], "answer": ["#### 2"]})
    with pytest.raises(ValueError, match=r"no 'prompt' column.*'question'.*gsm8k_to_conversational"):
        checks.check_train_dataset(data, [accuracy_reward])


def test_an_environment_may_supply_the_prompts():
    """GRPOTrainer 1.16 trains without a `prompt` column when an `environment_factory` owns the data (e.g. a dict of
    environments picked by an `environment` column, each `reset()` returning the prompt): not refused (issue 29)."""
    routing = Dataset.from_dict({"environment": ["math", "code"]})
    checks.check_train_dataset(routing, None, has_environments=True)
    with pytest.raises(ValueError, match="no 'prompt' column"):
        checks.check_train_dataset(routing, None)


def test_malformed_conversational_prompt_is_rejected():
    data = Dataset.from_dict({"prompt": [[{"text": "hi"}]], "solution": ["1"]})
    with pytest.raises(ValueError, match=r"train_dataset: row 0: 'prompt' message 0 is not a \{'role', 'content'\}"):
        checks.check_train_dataset(data, None)
    data = Dataset.from_dict({"prompt": [3], "solution": ["1"]})
    with pytest.raises(ValueError, match="train_dataset: row 0: 'prompt' is 3, not a string"):
        checks.check_train_dataset(data, None)
    checks.check_train_dataset(Dataset.from_dict({"prompt": ["Compute 1+1"]}), None)  # standard format is fine


def test_reward_function_missing_its_column_names_the_column(arithmetic):
    def needs_label(completions, label, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'needs_label' needs the argument 'label'.*columns \['prompt'"):
        checks.check_train_dataset(arithmetic, [accuracy_reward, needs_label])

    def no_kwargs(completions, solution):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'no_kwargs' does not accept \*\*kwargs"):
        checks.check_train_dataset(arithmetic, no_kwargs)
    checks.check_train_dataset(arithmetic, [accuracy_reward, format_reward])  # the library's rewards pass
    checks.check_train_dataset(None, None)  # an environment may own data and rewards


def test_trainer_construction_checks_before_loading_the_model(tmp_path):
    data = Dataset.from_dict({"text": ["Compute 1+1"]})
    with pytest.raises(ValueError, match="no 'prompt' column"):
        ECHOTrainer(model="/does/not/exist", reward_funcs=accuracy_reward, args=_tiny_args(tmp_path),
                    train_dataset=data)  # fmt: skip


def test_non_numeric_reward_fails_with_the_function_name():
    def stringly(completions, **kwargs):
        return ["1.0" for _ in completions]

    wrapped = checks.checked_reward_func(stringly)
    assert wrapped.__name__ == "stringly"
    with pytest.raises(TypeError, match=r"'stringly' returned str '1.0' for completion 0"):
        wrapped(completions=["a", "b"], prompts=["p", "p"])
    with pytest.raises(TypeError, match="'scalar' returned float"):
        checks.check_reward_output("scalar", 1.0)
    with pytest.raises(ValueError, match="'short' returned 1 rewards for 2 completions"):
        checks.check_reward_output("short", [1.0], 2)
    assert checks.checked_reward_func(accuracy_reward)(completions=["\\boxed{2}"], solution=["2"]) == [1.0]


def test_local_files_load_by_path_with_an_explicit_format(tmp_path):
    rows = [{"question": "What is 1+1?", "answer": "so #### 2"}, {"question": "2+2?", "answer": "#### 4"}]
    jsonl = tmp_path / "gsm.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    Dataset.from_list(rows).to_csv(tmp_path / "gsm.csv", index=False)
    Dataset.from_list(rows).to_parquet(tmp_path / "gsm.parquet")
    for path in ("gsm.jsonl", "gsm.csv", "gsm.parquet"):
        raw = adapters.load_raw_dataset(str(tmp_path / path))
        data = adapters.to_prompt_solution(raw, "gsm8k")
        assert data.column_names == ["prompt", "solution"] and data[0]["solution"] == "\\boxed{2}", path
    raw = adapters.load_raw_dataset(str(jsonl))
    with pytest.raises(ValueError, match=r"needs the columns \['prompt', 'solution'\].*--dataset_format gsm8k"):
        adapters.to_prompt_solution(raw, "prompt-answer")  # never guessed: the error names the option
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported extension"):
        adapters.load_raw_dataset(str(tmp_path / "data.txt"))
    with pytest.raises(FileNotFoundError):
        adapters.load_raw_dataset(str(tmp_path / "missing.jsonl"))


# ------------------------------------------------------------------------------------------------ 5. all-None rewards
def test_all_none_watch_warns_then_raises():
    watch = checks.AllNoneRewardWatch(limit=2)
    nan = torch.full((4, 2), float("nan"))
    with pytest.warns(UserWarning, match=r"\(always_none\).*\['solution'\]"):
        watch.update(nan, ["always_none"], ["solution"])
    watch.update(torch.tensor([[float("nan"), 1.0]] * 4), ["always_none"], ["solution"])  # a reward: count resets
    assert watch.consecutive == 0
    with pytest.warns(UserWarning):
        watch.update(nan, ["always_none"], ["solution"])
    with pytest.raises(RuntimeError, match="max_all_none_reward_batches"):
        watch.update(nan, ["always_none"], ["solution"])
    # the method configs stop; TRL's plain GRPOConfig (no such field) only warns, as GRPOTrainer does (issue 29)
    for args, limit in ((ECHOConfig("x"), checks.DEFAULT_MAX_ALL_NONE_REWARD_BATCHES), (object(), None)):
        trainer = types.SimpleNamespace(args=args, reward_func_names=["f"])
        checks.watch_all_none_rewards(trainer, torch.ones(4, 1), [{"solution": "2"}])
        assert trainer._all_none_reward_watch.limit == limit
    with pytest.raises(ValueError, match="max_all_none_reward_batches"):
        ECHOConfig("x", max_all_none_reward_batches=0)


# ------------------------------------------------------------------------------------------------ 7. the demo's output
def test_failed_run_leaves_no_empty_output_folder(tmp_path, monkeypatch):
    out = tmp_path / "never"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(ValueError, match="--dataset_format"):
        cli.train("echo", ["--dataset_name", str(bad), "--output_dir", str(out)])
    assert not out.exists()

    def boom(*args, **kwargs):  # fails after the trainer (and whatever it creates) exists
        out.mkdir(exist_ok=True)
        raise RuntimeError("boom")

    monkeypatch.setattr(offline, "greedy_accuracy", boom)
    with pytest.raises(RuntimeError, match="boom"):
        cli.train("echo", ["--num_train_examples", "16", "--output_dir", str(out)])
    assert not out.exists()
