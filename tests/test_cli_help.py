"""The command line on TRL's own parser (issue 36): a method's `--help` leads with its own knobs (within the first 30
lines), then the script's options, then TRL's and transformers'; the defaults it shows are the ones parsing applies;
argument and `--config` errors are one line naming the fix; an error before training is one line, its traceback
behind `--debug` or `TRL_GROUPOPT_DEBUG=1`; Ctrl-C and SIGTERM name what to run next and exit 130 and 143; `compare`
dispatches to `trl_groupopt.comparison.driver.main`. (The lazy imports of `--help` without a method:
tests/e2e/test_lazy_imports.py.)"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import signal
import sys
import time
import types

import pytest
from trl import GRPOConfig

from tests.selection import tested_methods
from trl_groupopt import METHODS
from trl_groupopt.cli import main as cli
from trl_groupopt.cli import script
from trl_groupopt.data import adapters
from trl_groupopt.methods.registry import get_method


def _run(argv, capsys, main=cli.main):
    """(exit status, stdout, stderr) of the console entry point."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def _headings(text: str) -> list[str]:
    return re.findall(r"^(\S.*):$", text, flags=re.M)


# ------------------------------------------------------------------------------------------------ the help
def own_knobs(config_class: type) -> list[str]:
    """The fields that the config's own module declares and TRL's GRPOConfig does not have: the method's knobs."""
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    fields = {f.name for f in dataclasses.fields(config_class)}
    declared = [name for cls in reversed(config_class.__mro__) if cls.__module__ == config_class.__module__
                for name in inspect.get_annotations(cls)]  # fmt: skip
    return [name for name in dict.fromkeys(declared) if name in fields and name not in trl_fields]


@pytest.mark.parametrize("method", tested_methods())
def test_the_help_shows_the_methods_own_knobs_in_its_first_30_lines(method, capsys):
    """The acceptance check of issue 36 (`dfpo_transform` for dfpo), for every method: its first knob, or that it has
    none of its own."""
    knobs = own_knobs(get_method(method).config_class)
    status, text, _ = _run(["train", "--method", method, "--help"], capsys)
    assert status == 0
    head = "\n".join(text.splitlines()[:30])
    assert (f"--{knobs[0]}" if knobs else "no options of its own") in head, text[:3000]


def test_dfpo_help_leads_with_the_method_then_its_trl_defaults_then_the_script_then_trl(capsys):
    _, text, _ = _run(["train", "--method", "dfpo", "--help"], capsys)
    headings = _headings(text)
    assert headings[:3] == ["options", f"dfpo options: {get_method('dfpo').summary}",
                            "TRL options dfpo sets its own default for"]  # fmt: skip
    assert headings[3] == "options every trl-groupopt method adds" and headings[4].startswith("script options")
    assert headings[-3:] == [
        "TRL GRPOConfig",
        "TRL ModelConfig: model loading, LoRA (PEFT), quantization",
        "transformers TrainingArguments",
    ]
    assert re.search(r"^  --config YAML ", text, flags=re.M)
    own = text[text.index(headings[1]) : text.index(headings[2])]
    for knob in ("--dfpo_transform", "--dfpo_orth_floor", "--dfpo_orthogonal_over"):
        assert knob in own, knob
    assert "--learning_rate" not in own and "--epsilon" not in own and "--max_all_none_reward_batches" not in own
    shared = text[text.index(headings[3]) : text.index(headings[4])]
    assert "--max_all_none_reward_batches" in shared and "--advantage_estimator" in shared
    redeclared = text[text.index(headings[2]) : text.index(headings[3])]
    assert "--epsilon" in redeclared and "--loss_type" in redeclared and "--learning_rate" not in redeclared


@pytest.mark.parametrize("method", tested_methods())
def test_help_lists_every_option_of_the_training_parser_with_its_default(method, capsys):
    """Nothing the parser accepts is missing from the help, and the defaults shown are the ones it applies."""
    _, text, _ = _run(["train", "--method", method, "--help"], capsys)
    fields = [*dataclasses.fields(script.DemoScriptArguments), *dataclasses.fields(get_method(method).config_class)]
    for f in fields:
        assert re.search(rf"^  (.*, )?--{re.escape(f.name)}\b", text, flags=re.M), (method, f.name)
    parser = script.MethodParser(method, "prog")
    _, args, _, _ = cli.parse(method, [])
    for dest in ("max_steps", "num_generations", "dataset_format", "report_to"):
        entry = re.search(rf"^  --{dest} (.*?)(?=^  -)", text, flags=re.M | re.S).group(1)
        shown = f"(default: {parser.get_default(dest)})"
        assert "".join(shown.split()) in "".join(entry.split()), (method, dest, entry)  # wrapped at any character
    entry = re.search(r"^  --learning_rate (.*?)(?=^  -)", text, flags=re.M | re.S).group(1)
    assert f"{args.learning_rate} (embedded policy)" in " ".join(entry.split())  # a model-dependent default


def test_grpo_has_no_knobs_of_its_own_and_says_so(capsys):
    _, text, _ = _run(["train", "--method", "grpo", "--help"], capsys)
    assert _headings(text)[1].startswith("grpo options: ") and "no options of its own" in text


def test_each_entry_point_names_itself(capsys, monkeypatch):
    _, text, _ = _run(["train", "--method", "otb", "--help"], capsys)
    assert text.startswith("usage: trl-groupopt train --method otb ")
    monkeypatch.setattr(sys, "argv", ["examples/train_otb.py", "--help"])
    status, text, _ = _run(None, capsys, main=lambda argv: cli.command("otb"))
    assert status == 0 and text.startswith("usage: train_otb.py ") and "--otb_handle_zero_tail" in text
    monkeypatch.setattr(sys, "argv", ["examples/train_otb.py", "--learnig_rate", "1"])
    status, _, err = _run(None, capsys, main=lambda argv: cli.command("otb"))
    assert status == 2 and err.startswith("train_otb.py: error: ")


def test_the_parser_is_trls_and_reads_argv_once(monkeypatch):
    """`TrlParser((ScriptArguments, <Method>Config, ModelConfig))`, one `parse_args_and_config` call per parse."""
    from trl import ModelConfig, ScriptArguments, TrlParser

    calls = []
    original = TrlParser.parse_args_and_config
    monkeypatch.setattr(
        TrlParser, "parse_args_and_config", lambda self, *a, **k: calls.append(a) or original(self, *a, **k)
    )
    cli.parse("dfpo", ["--max_steps", "2"])
    assert len(calls) == 1
    parser = script.MethodParser("dfpo", "prog")
    assert isinstance(parser, TrlParser) and issubclass(parser.dataclass_types[0], ScriptArguments)
    assert parser.dataclass_types[1:] == [get_method("dfpo").config_class, ModelConfig]


# ------------------------------------------------------------------------------------------------ defaults
def test_the_embedded_policy_trains_in_fp32_even_where_the_device_runs_bf16(monkeypatch):
    """The README's 18.0% -> 31.5% is an fp32 result: the CLI keeps the embedded policy in fp32 on a bf16 GPU too;
    a named model gets bf16 there."""
    monkeypatch.setattr(script, "device_supports_bf16", lambda use_cpu=False: True)
    for method in METHODS:
        _, args, _, demo = cli.parse(method, [])
        assert demo and args.bf16 is False, method
    parser = script.MethodParser("echo", "prog")  # (this CPU cannot build a bf16 config: the parsed values)
    assert parser.parse_known_args(["--model_name_or_path", "some-org/some-model", "--use_cpu", "false"])[0].bf16
    assert parser.parse_known_args(["--bf16", "true"])[0].bf16 is True  # the user's choice wins


def test_save_steps_alone_saves_and_explicit_strategies_win(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("save_strategy: epoch\n")
    for argv, strategy in ((["--save_ste", "4"], "steps"), (["--save-steps=4", f"--config={config}"], "epoch"),
                           (["--save_steps", "4", "--save_strategy", "no"], "no")):  # fmt: skip
        _, args, _, _ = cli.parse("echo", argv)
        assert (args.save_strategy, args.save_steps) == (strategy, 4), argv


# ------------------------------------------------------------------------------------------------ argument errors
@pytest.mark.parametrize(
    "argv,says",
    [
        (["--learnig_rate", "1e-5"], "unknown option --learnig_rate (did you mean --learning_rate?)"),
        (["--dataset_format", "csv"], "invalid choice: 'csv' (choose from 'prompt-answer', 'gsm8k', 'math')"),
        (["--learning_rate", "fast"], "argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
        (["--use_peft", "maybe"], "argument --use_peft/--use-peft: Truthy value expected: got maybe"),
        (["--max_steps"], "argument --max_steps/--max-steps: expected one argument"),
        (["--reward_funcs", "accuracy"], "invalid choice: 'accuracy' (choose from 'accuracy_reward', "),
        (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
    ],
)
def test_argument_errors_are_one_line_naming_the_fix(argv, says, capsys):
    status, out, err = _run(["train", "--method", "dfpo", *argv], capsys)
    assert status == 2 and out == ""
    assert err.startswith("trl-groupopt train --method dfpo: error: ") and err.count("\n") == 1
    assert says in err, err


def test_config_file_keys_are_checked_like_options(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1.0e-5\nmax_stpes: 3\nenv:\n  WANDB_MODE: offline\n")
    status, _, err = _run(["train", "--method", "echo", "--config", str(config)], capsys)
    assert status == 2 and err.count("\n") == 1
    assert f"--config {config}: unknown key max_stpes (did you mean max_steps?)" in err
    config.write_text("max_steps: [3\n")
    status, _, err = _run(["train", "--method", "echo", "--config", str(config)], capsys)
    assert status == 2 and err.count("\n") == 1 and "is not valid YAML" in err


def test_trls_parser_reads_every_form_of_an_option(tmp_path):
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


# ------------------------------------------------------------------------------------------------ errors, Ctrl-C
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


def test_an_existing_file_as_output_dir_is_one_line(tmp_path, capsys):
    taken = tmp_path / "results.txt"
    taken.write_text("x")
    status, _, err = _run(["train", "--method", "echo", "--output_dir", str(taken)], capsys)
    assert status == 1 and err.count("\n") == 1 and f"--output_dir {taken} is a file: give a folder" in err


def _interrupted(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_names_what_works_next_and_exits_130(tmp_path, capsys, monkeypatch):
    """Issue 46, weak: Ctrl-C before the first checkpoint printed a resume command that failed ("holds no
    checkpoint"). What it prints now follows what the run left: its last complete checkpoint to resume, or the same
    command again (only incomplete checkpoints refuse no fresh run: tests/test_incomplete_checkpoints.py); never the
    token."""
    from tests.test_resume_rules import _checkpoint

    monkeypatch.setattr(script, "run", _interrupted)
    out = tmp_path / "out"
    argv = ["--max_steps", "5", "--output_dir", str(out), "--overwrite_output_dir", "--hub_token", "hf_secret"]
    status, _, err = _run(["train", "--method", "echo", *argv], capsys)
    assert status == 130 and "Traceback" not in err and err.strip().count("\n") == 0 and "hf_secret" not in err
    again = f"trl-groupopt train --method echo --max_steps 5 --output_dir {out}"
    assert err.strip().endswith(f"nothing to resume; run it again with: {again} (--hub_token left out: give it "
                                "again, or set HF_TOKEN)"), err  # fmt: skip
    assert not out.exists()  # the run created it and wrote nothing
    _checkpoint(out, 2, max_steps=5)
    (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"cut")  # incomplete: no resume, a fresh run sets it aside
    status, _, err = _run(["train", "--method", "echo", *argv[:-2]], capsys)
    assert status == 130 and err.strip().endswith(f"run it again with: {again}"), err
    monkeypatch.setattr(adapters, "load_datasets", _interrupted)  # while the data loads, before training
    (out / "checkpoint-2").rename(out / "checkpoint-3")
    _checkpoint(out, 2, max_steps=5)
    monkeypatch.setattr(sys, "argv", ["examples/train_echo.py", "--output_dir", str(out), "--max_steps", "5",
                                      "--resume_from_checkpoint", "last"])  # fmt: skip
    status, _, err = _run(None, capsys, main=lambda argv: cli.command("echo"))
    assert status == 130 and err.strip().endswith(
        f"Resume from the last checkpoint with: python examples/train_echo.py --output_dir {out} --max_steps 5 "
        "--resume_from_checkpoint last"
    ), err


def test_a_second_ctrl_c_while_stopping_gives_no_traceback(tmp_path, capsys, monkeypatch):
    """Issue 46, weak: a second Ctrl-C while the first was handled (`gc.collect()`, the lock's release) raised a
    KeyboardInterrupt traceback from there. The command ignores further signals once it is stopping."""

    def second_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # where the default handler raised

    def first_ctrl_c(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    monkeypatch.setattr(script, "run", first_ctrl_c)
    monkeypatch.setattr(cli.gc, "collect", second_ctrl_c)
    try:
        status, _, err = _run(["train", "--method", "echo", "--output_dir", str(tmp_path / "out")], capsys)
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C escaped as a KeyboardInterrupt")
    assert status == 130 and "Traceback" not in err and "interrupted." in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the command


def test_sigterm_is_handled_like_ctrl_c(tmp_path, capsys, monkeypatch):
    """Issue 46, weak: SIGTERM (a scheduler's stop) exited 143 with no message and left the lock, taken over on
    resume. Now: one line naming what to run next, the lock released, exit 143."""
    from tests.test_resume_rules import _checkpoint
    from trl_groupopt.runfolder.lock import LOCK_NAME

    out = tmp_path / "out"
    _checkpoint(out, 2, max_steps=5)
    held = []

    def terminated(*args, **kwargs):
        held.append((out / LOCK_NAME).is_file())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    def unhandled(signum, frame):  # what the default does to this test process, short of ending it
        raise RuntimeError("SIGTERM reached the default handler")

    monkeypatch.setattr(script, "run", terminated)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        argv = ["train", "--method", "echo", "--output_dir", str(out), "--max_steps", "5"]
        status, _, err = _run([*argv, "--resume_from_checkpoint", "last"], capsys)
        assert signal.getsignal(signal.SIGTERM) is unhandled  # restored after the command
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert held == [True] and status == 143 and "Traceback" not in err and err.strip().count("\n") == 0
    resume = f"trl-groupopt {' '.join(argv)} --resume_from_checkpoint last"
    assert err.strip().endswith(f"echo: terminated (SIGTERM). Resume from the last checkpoint with: {resume}"), err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"]  # the lock released


def test_bare_debug_is_ours_and_debug_with_a_value_is_transformers():
    assert cli.take_debug_flag(["--debug"]) == ([], True)
    assert cli.take_debug_flag(["--debug", "--max_steps", "3"]) == (["--max_steps", "3"], True)
    assert cli.take_debug_flag(["--debug", "underflow_overflow"]) == (["--debug", "underflow_overflow"], False)


# ------------------------------------------------------------------------------------------------ compare
def test_compare_dispatches_its_arguments_and_exit_code(monkeypatch):
    received = []
    module = types.ModuleType("trl_groupopt.comparison.driver")
    module.main = lambda argv: received.append(argv) or 3
    monkeypatch.setitem(sys.modules, "trl_groupopt.comparison.driver", module)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compare", "--methods", "echo", "dfpo", "--help"])
    assert exit_info.value.code == 3 and received == [["--methods", "echo", "dfpo", "--help"]]
