"""Option values refused by the command line before the data is read or a model loads (issue 46, broken 7 and 9 and
the weak options): one line, ``prog: error: --option value: the fix``, exit 2, from the one table of rules in
`trl_groupopt/trainer/args_check.py` (the Python API's checks of the same table: tests/trainers/test_args_check.py).

Before, each value below passed the parser: most crashed after the model loaded with a 60-line traceback (a NaN
temperature, a negative top_entropy_quantile whose message said "got 2"), some trained nothing and exited 0 (a NaN or
zero reward weight: loss 0.0, grad norm 0.0), some ran on silently (an infinite temperature, a weight decay of -1, a
save_steps of -1), and a 0 count raised `ZeroDivisionError` in TRL's config."""

from __future__ import annotations

import pytest

from trl_groupopt.cli import main as cli

#: issue 46, broken 9: values that crashed after the model loaded
CRASHED_AFTER_LOADING = [
    ("temperature", "0"), ("temperature", "-1"), ("temperature", "nan"),
    ("top_p", "-1"), ("top_p", "2"),
    ("min_p", "-1"), ("min_p", "nan"),
    ("repetition_penalty", "0"), ("repetition_penalty", "-1"), ("repetition_penalty", "nan"),
    ("top_k", "-1"),
    ("adam_beta1", "-1"), ("adam_beta1", "nan"), ("adam_beta2", "-1"), ("adam_beta2", "nan"),
    ("adam_epsilon", "-1"), ("adam_epsilon", "nan"),
    ("per_device_train_batch_size", "0"),
    ("scale_rewards", "groups"),
    ("top_entropy_quantile", "-1"), ("top_entropy_quantile", "-0.5"),
]  # fmt: skip
#: issue 46, broken 7: trained nothing and exited 0
TRAINED_NOTHING = [("reward_weights", "nan"), ("reward_weights", "inf"), ("reward_weights", "0")]
#: issue 46, weak: accepted with no message, or a ZeroDivisionError
ACCEPTED_SILENTLY = [
    ("temperature", "inf"), ("repetition_penalty", "inf"), ("adam_epsilon", "inf"),
    ("top_p", "nan"), ("top_p", "inf"), ("top_p", "0"),
    ("weight_decay", "-1"),
    ("top_entropy_quantile", "nan"), ("top_entropy_quantile", "2"),
    ("save_steps", "0"), ("save_steps", "-1"), ("logging_steps", "-1"),
    ("num_generations", "0"), ("gradient_accumulation_steps", "0"), ("steps_per_generation", "0"),
]  # fmt: skip


def _refusal(method: str, argv: list[str], capsys) -> str:
    prog = f"trl-groupopt train --method {method}"
    with pytest.raises(SystemExit) as exit_info:
        cli.train(method, argv, prog=prog)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("method", ["grpo", "echo"])
@pytest.mark.parametrize("option,value", CRASHED_AFTER_LOADING + TRAINED_NOTHING + ACCEPTED_SILENTLY)
def test_a_bad_option_value_is_refused_before_the_data_is_read(option, value, method, tmp_path, capsys,
                                                                nothing_loads):  # fmt: skip
    argv = [f"--{option}", value, "--output_dir", str(tmp_path / "out")]
    if option == "save_steps":
        argv += ["--save_strategy", "steps"]
    err = _refusal(method, argv, capsys)
    from trl_groupopt.trainer.args_check import RULES

    assert f"error: --{option} " in err and f": {RULES[option].fix}" in err, err
    assert not (tmp_path / "out").exists()


def test_every_bad_value_is_named_at_once(tmp_path, capsys, nothing_loads):
    err = _refusal("dfpo", ["--temperature", "0", "--top_p", "nan", "--reward_weights", "0"], capsys)
    assert "--temperature 0.0: the sampling temperature must be a finite number > 0" in err
    assert "; --top_p nan: it must be within (0, 1]" in err and "; --reward_weights 0.0: every weight" in err


def test_the_method_knobs_must_be_finite(tmp_path, capsys):
    """ECHO's `batch_epsilon_high` and CTPO's `ctpo_dual_clip` at inf were accepted: their method's config refuses
    them (one line, exit 1, before the data door)."""
    for method, option, says in (("echo", "--batch_epsilon_high", "batch_epsilon_high must be a finite number > 0"),
                                 ("ctpo", "--ctpo_dual_clip", "ctpo_dual_clip must be a finite number > 0")):  # fmt: skip
        with pytest.raises(ValueError, match=says):
            cli.parse(method, [option, "inf", "--output_dir", str(tmp_path / "out")])


def test_good_values_pass(tmp_path):
    _, args, _, _ = cli.parse("echo", ["--temperature", "0.7", "--top_p", "1", "--min_p", "0", "--top_k", "0",
                                       "--reward_weights", "0", "1", "--reward_funcs", "accuracy_reward",
                                       "format_reward", "--save_strategy", "no", "--save_steps", "0"])  # fmt: skip
    assert args.reward_weights == [0.0, 1.0] and args.temperature == 0.7


def test_one_reward_weight_per_reward_function(tmp_path, capsys, nothing_loads):
    err = _refusal("otb", ["--reward_weights", "1", "2"], capsys)
    assert "--reward_weights 1.0 2.0: give one weight per --reward_funcs (accuracy_reward)." in err
