"""Help that leads (issue 30): a method's `--help` lists its own knobs first under its one-line summary, then the
script's options (with `--config`), then TRL's groups under their headings; each entry point names itself; argument
errors are one line naming the fix; an error before training is one line, its traceback behind `--debug` or
`TRL_GROUPOPT_DEBUG=1`. The options behind the help are cached (trl_groupopt/options.py): the cached description
equals the live one. (That the cached path imports no TRL and costs under 2 s of CPU, in fresh processes:
tests/e2e/test_lazy_imports.py.)"""

from __future__ import annotations

import re
import sys

import pytest

from trl_groupopt import METHODS, cli, script
from trl_groupopt.registry import get_method


def _run(argv, capsys, main=cli.main):
    """(exit status, stdout, stderr) of the console entry point."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def _headings(text: str) -> list[str]:
    return re.findall(r"^(\S.*):$", text, flags=re.M)


# ------------------------------------------------------------------------------------------------ the help
def test_dfpo_help_leads_with_the_method_then_the_script_then_trl(capsys):
    status, text, _ = _run(["train", "--method", "dfpo", "--help"], capsys)
    assert status == 0
    assert text.index("--dfpo_transform") < text.index("--learning_rate")  # the acceptance check
    assert re.search(r"^  --config YAML ", text, flags=re.M)
    headings = _headings(text)
    assert headings[0] == f"dfpo options: {get_method('dfpo').summary}"
    assert headings[1].startswith("script options")
    trl = [h for h in headings if h.startswith("TRL GRPOConfig: ")]
    assert "TRL GRPOConfig: generation" in trl and "TRL GRPOConfig: the training" in trl and len(trl) >= 6
    assert headings[-2][:15] == "TRL ModelConfig" and headings[-1][:37] == "transformers TrainingArguments (every"
    section = text[text.index(headings[0]) : text.index(headings[1])]
    for knob in ("--dfpo_transform", "--dfpo_orth_floor", "--dfpo_orthogonal_over", "--loss_type"):
        assert knob in section, knob
    assert "--learning_rate" not in section and "--max_all_none_reward_batches" not in section
    assert section.index("--dfpo_transform") < section.index("--epsilon")  # the method's own fields, then overrides
    generation = text[text.index("TRL GRPOConfig: generation:") :]
    assert generation.index("--temperature") < generation.index("TRL GRPOConfig: generation acceleration")


@pytest.mark.parametrize("method", list(METHODS))
def test_help_lists_every_option_of_the_training_parser_with_its_default(method, capsys):
    """Nothing the real parser accepts is missing from the help, and the defaults shown are the ones it applies."""
    _, text, _ = _run(["train", "--method", method, "--help"], capsys)
    parser = script.build_parser(method, [])
    for action in parser._actions:
        for flag in action.option_strings:
            assert re.search(rf"^  (.*, )?{re.escape(flag)}\b", text, flags=re.M), (method, flag)
    for dest in ("max_steps", "learning_rate", "output_dir", "report_to", "num_generations", "dataset_format"):
        entry = re.search(rf"^  --{dest} (.*?)(?=^  -)", text, flags=re.M | re.S).group(1)
        shown = f"(default: {parser.get_default(dest)})"
        assert "".join(shown.split()) in "".join(entry.split()), (method, dest, entry)  # wrapped at any character


def test_the_run_folder_options_are_listed_with_the_script_as_the_command_reads_them(capsys):
    """--resume_from_checkpoint ('last') and --save_steps (implies --save_strategy steps) mean more here than in
    transformers: they sit with the script's options, with that meaning; --overwrite_output_dir is the script's."""
    _, text, _ = _run(["train", "--method", "echo", "--help"], capsys)
    headings = _headings(text)
    section = text[text.index(headings[1]) : text.index(headings[2])]
    for flag, says in (("--resume_from_checkpoint", "'last'"), ("--save_steps", "implies --save_strategy steps"),
                       ("--overwrite_output_dir", "deleted first")):  # fmt: skip
        entry = re.search(rf"^  {flag} (.*?)(?=^  -)", section, flags=re.M | re.S)
        assert entry and says in " ".join(entry.group(1).split()), flag
    assert "--save_strategy" not in re.findall(r"^  (--\S+)", section, flags=re.M)


def test_the_check_names_the_options_argv_sets_abbreviated_or_in_the_config(tmp_path):
    """What build_parser's defaults follow (--save_steps without --save_strategy)."""
    config = tmp_path / "run.yaml"
    config.write_text("save_strategy: epoch\n")
    assert cli.check_argv("echo", ["--save_ste", "4"], "prog") == {"save_steps"}
    assert cli.check_argv("echo", ["--save-steps=4", "--config", str(config)], "prog") == {
        "save_steps",
        "save_strategy",
    }


def test_grpo_has_no_knobs_of_its_own_and_says_so(capsys):
    _, text, _ = _run(["train", "--method", "grpo", "--help"], capsys)
    headings = _headings(text)
    assert headings[0].startswith("grpo options: ") and headings[1].startswith("script options")
    assert "no options of its own" in text


def test_each_entry_point_names_itself(capsys, monkeypatch):
    _, text, _ = _run(["train", "--method", "otb", "--help"], capsys)
    assert text.startswith("usage: trl-groupopt train --method otb ")
    monkeypatch.setattr(sys, "argv", ["examples/train_otb.py", "--help"])
    status, text, _ = _run(None, capsys, main=lambda argv: cli.command("otb"))
    assert status == 0 and text.startswith("usage: train_otb.py ") and "--otb_handle_zero_tail" in text
    assert "trl-groupopt train" not in text.splitlines()[0]
    monkeypatch.setattr(sys, "argv", ["examples/train_otb.py", "--learnig_rate", "1"])
    status, _, err = _run(None, capsys, main=lambda argv: cli.command("otb"))
    assert status == 2 and err.startswith("train_otb.py: error: ")


# ------------------------------------------------------------------------------------------------ argument errors
@pytest.mark.parametrize(
    "argv,says",
    [
        (["--learnig_rate", "1e-5"], "unknown option --learnig_rate (did you mean --learning_rate?)"),
        (["--dataset_format", "csv"], "invalid choice: 'csv' (choose from 'prompt-answer', 'gsm8k', 'math')"),
        (["--learning_rate", "fast"], "argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
        (["--use_peft", "maybe"], "argument --use_peft/--use-peft: Truthy value expected: got maybe"),
        (["--max_steps"], "argument --max_steps/--max-steps: expected one argument"),
        (["--reward_funcs", "accuracy"], "--reward_funcs: unknown ['accuracy']; choose from ['accuracy_reward', "),
    ],
)
def test_argument_errors_are_one_line_naming_the_fix(argv, says, capsys):
    status, out, err = _run(["train", "--method", "dfpo", *argv], capsys)
    assert status == 2 and out == ""
    assert err == f"trl-groupopt train --method dfpo: error: {err.split(': error: ', 1)[1]}" and err.count("\n") == 1
    assert says in err, err


def test_config_file_keys_are_checked_like_options(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1.0e-5\nmax_stpes: 3\nenv:\n  WANDB_MODE: offline\n")
    status, _, err = _run(["train", "--method", "echo", "--config", str(config)], capsys)
    assert status == 2 and err.count("\n") == 1
    assert f"--config {config}: unknown key max_stpes (did you mean max_steps?)" in err


def test_what_the_fast_check_accepts_trl_parses_the_same_way(tmp_path):
    """The check before TRL rejects nothing TRL's parser accepts: bare and explicit booleans, `none`, lists,
    hyphenated aliases, `--no_` flags and a config file all reach the same values."""
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 3\n")
    argv = ["--config", str(config), "--use-peft", "--lora_target_modules", "q_proj", "v_proj", "--gradient_checkpointing",
            "false", "--no_evaluate_accuracy", "--max_grad_norm", "0.5", "--ctpo_position_power", "none", "--dataset-format", "gsm8k",
            "--lr_scheduler_type", "cosine", "--report_to", "none", "--seed", "7"]  # fmt: skip
    script_args, training_args, model_args, _ = cli.parse("ctpo", argv)
    assert model_args.use_peft and model_args.lora_target_modules == ["q_proj", "v_proj"]
    assert training_args.gradient_checkpointing is False and script_args.evaluate_accuracy is False
    assert training_args.max_steps == 3 and training_args.ctpo_position_power == 0.5 and training_args.seed == 7
    assert script_args.dataset_format == "gsm8k" and training_args.max_grad_norm == 0.5


# ------------------------------------------------------------------------------------------------ errors at the door
def test_an_error_before_training_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    argv = ["train", "--method", "echo", "--dataset_name", str(empty), "--output_dir", str(tmp_path / "out")]
    status, _, err = _run(argv, capsys)
    assert status == 1 and err.count("\n") == 1
    assert err.startswith(f"trl-groupopt train --method echo: error: --dataset_name {empty} is empty")
    assert err.rstrip().endswith("(--debug shows the traceback)")
    with pytest.raises(ValueError, match="is empty"):
        cli.main([*argv, "--debug"])
    monkeypatch.setenv(cli.DEBUG_ENVIRONMENT_VARIABLE, "1")
    with pytest.raises(ValueError, match="is empty"):
        cli.main(argv)


def test_an_error_after_trl_parses_is_one_line_too(capsys):
    status, _, err = _run(["train", "--method", "dfpo", "--dfpo_transform", "nope"], capsys)
    assert status == 1 and err.count("\n") == 1 and "dfpo_transform must be one of" in err


def test_bare_debug_is_ours_and_debug_with_a_value_is_transformers():
    assert cli.take_debug_flag(["--debug"]) == ([], True)
    assert cli.take_debug_flag(["--debug", "--max_steps", "3"]) == (["--max_steps", "3"], True)
    assert cli.take_debug_flag(["--debug", "underflow_overflow"]) == (["--debug", "underflow_overflow"], False)


# ------------------------------------------------------------------------------------------------ the cache
@pytest.fixture
def options():
    from trl_groupopt import options  # here: the help's tests above also run where the module does not exist

    return options


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_GROUPOPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_holds_what_trls_parser_builds(options, empty_cache):
    described = options.method_options("echo")  # computes every shipped method and caches them
    files = sorted(p.name for p in empty_cache.glob("options/*/*.json"))
    assert files == sorted(f"{name}.json" for name in METHODS)
    for name in METHODS:
        assert options.method_options(name) == script.live_options(name), name  # read back, JSON round trip
    assert described == script.live_options("echo")


def test_the_cache_key_follows_versions_and_source(options, empty_cache, monkeypatch):
    options.method_options("otb")
    first = options._key()
    monkeypatch.setattr(options, "_version", lambda distribution: "0.0.0")  # another TRL / transformers
    assert options._key() != first and options._read("otb", options._key()) is None
    options.method_options("otb")  # recomputed under the new key, the old key's folder kept beside it
    assert sorted(p.name for p in (empty_cache / "options").iterdir()) == sorted([first, options._key()])
    for version in range(options.KEPT_KEYS + 2):
        monkeypatch.setattr(options, "_version", lambda distribution, v=version: f"9.{v}")
        options.store_options({"otb": []})
    kept = {p.name for p in (empty_cache / "options").iterdir()}
    assert len(kept) == options.KEPT_KEYS and options._key() in kept  # the newest stay


def test_a_method_registered_at_run_time_is_never_cached(options, empty_cache, monkeypatch):
    import dataclasses

    from trl_groupopt import registry

    spec = dataclasses.replace(get_method("otb"), summary="a test's own otb")
    monkeypatch.setitem(registry._METHODS, "otb", spec)
    assert options._shipped() == [name for name in METHODS if name != "otb"]
    assert options.method_options("otb") == script.live_options("otb")
    assert not list(empty_cache.glob("options/*/otb.json"))


def test_an_unwritable_cache_costs_only_time(options, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TRL_GROUPOPT_CACHE", str(blocker))
    assert options.method_options("dfpo") == script.live_options("dfpo")
