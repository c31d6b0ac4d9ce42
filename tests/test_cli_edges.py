"""What a new user and a fault campaign met at the command line (issue 51): negative numbers given with a space are
read as values (argparse read `-1e-4` as an unknown option: "expected one argument"), `--max_completion_length 0`
or `-1` is refused at parse naming the option (it was refused after the model loaded, naming transformers'
`max_new_tokens`), and `--batch_epsilon inf` is refused naming `batch_epsilon` (it named the defaulted
`batch_epsilon_high`)."""

from __future__ import annotations

import pytest

from trl_groupopt.cli import main as cli


def _refusal(argv: list[str], capsys, method: str = "grpo") -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.train(method, argv, prog="prog")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("prog: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("learning_rate", "-1e-4", "--learning_rate -0.0001: it must be a finite number >= 0"),
        ("learning_rate", "-1E-4", "--learning_rate -0.0001: it must be a finite number >= 0"),
        ("weight_decay", "-.5e1", "--weight_decay -5.0: it must be a finite number >= 0"),
        ("temperature", "-inf", "--temperature -inf: the sampling temperature must be a finite number > 0"),
        ("max_grad_norm", "-2.5", "--max_grad_norm -2.5: it must be a finite number >= 0"),
    ],
)
def test_a_negative_number_after_a_space_is_read_as_the_value(option, value, says, tmp_path, capsys, nothing_loads):
    spaced = _refusal([f"--{option}", value, "--output_dir", str(tmp_path)], capsys)
    joined = _refusal([f"--{option}={value}", "--output_dir", str(tmp_path)], capsys)
    assert says in spaced and spaced == joined


def test_a_negative_number_after_a_space_reaches_the_value_it_sets(tmp_path):
    _, args, _, _ = cli.parse("grpo", ["--reward_weights", "-1", "2.5e-1", "--reward_funcs", "accuracy_reward",
                                       "format_reward", "--output_dir", str(tmp_path)])  # fmt: skip
    assert args.reward_weights == [-1.0, 0.25]


def test_the_top_level_command_passes_a_spaced_negative_number_on(tmp_path, capsys, nothing_loads):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--method", "grpo", "--learning_rate", "-1e-4", "--output_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--learning_rate -0.0001: it must be a finite number >= 0" in err, err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_completion_length_below_one_is_refused_at_parse(value, tmp_path, capsys, nothing_loads):
    err = _refusal(["--max_completion_length", value, "--output_dir", str(tmp_path)], capsys)
    assert f"--max_completion_length {value}: the most tokens a completion may have: it must be an integer >= 1" in err
    assert "max_new_tokens" not in err


def test_max_completion_length_below_one_is_refused_by_the_python_api(tmp_path):
    from trl import GRPOConfig

    from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
    from trl_groupopt import GroupOptTrainer

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(**cpu_config_kwargs(tmp_path, max_completion_length=0))
    with pytest.raises(ValueError, match=r"max_completion_length=0: the most tokens a completion may have"):
        GroupOptTrainer(tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(),
                        processing_class=tokenizer)  # fmt: skip


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_batch_epsilon_inf_is_refused_naming_batch_epsilon(value, tmp_path):
    with pytest.raises(ValueError) as raised:
        cli.parse("echo", ["--batch_epsilon", value, "--output_dir", str(tmp_path)])
    assert str(raised.value).startswith("batch_epsilon ") and "batch_epsilon_high" not in str(raised.value)


@pytest.mark.parametrize(("method", "says"), [
    ("echo", "2 optimizer steps per rollout (ECHOConfig's default in Python: 8)"),
    ("ctpo", "2 optimizer steps per rollout (CTPOConfig's default in Python: 16)"),
    ("otb", "2 optimizer steps per rollout"),
])  # fmt: skip
def test_the_command_line_says_its_schedule_and_the_python_default_where_they_differ(method, says, tmp_path):
    """Issue 51, new user 6: the command line trained ECHO and CTPO at 2 optimizer steps per rollout, the Python API
    at 8 and 16, and the method pages described only the API's."""
    from trl_groupopt.methods.registry import get_method
    from trl_groupopt.trainer.schedule import schedule_text

    _, args, _, _ = cli.parse(method, ["--output_dir", str(tmp_path)])
    assert schedule_text(args, get_method(method).config_class) == says
    _, args, _, _ = cli.parse(method, ["--steps_per_generation", "32", "--gradient_accumulation_steps", "2"])
    assert schedule_text(args, get_method(method).config_class).startswith("16 optimizer steps per rollout")


def test_the_method_pages_state_both_schedules():
    from pathlib import Path

    from trl_groupopt.cli.defaults import RUN_DEFAULTS
    from trl_groupopt.methods.registry import get_method

    cli_updates = RUN_DEFAULTS["steps_per_generation"] // RUN_DEFAULTS["gradient_accumulation_steps"]
    for method in ("echo", "ctpo"):
        page = (Path(__file__).parents[1] / "docs" / f"{method}.md").read_text()
        section = page[page.index("## Default schedule") :].split("\n## ")[0]
        own = get_method(method).config_class.updates_per_rollout
        assert f"{own} optimizer steps per rollout" in section
        assert f"trains every method at {cli_updates} optimizer steps per rollout" in " ".join(section.split())
        assert f"--steps_per_generation {2 * own} --gradient_accumulation_steps 2" in section
