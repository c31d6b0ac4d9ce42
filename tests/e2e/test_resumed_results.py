"""A resumed run's ``results.json`` reports the whole run (issue 51, new user 5: it kept the held-out curve only from
the resume on and `wall_seconds` only for the resumed part, and the resumed run scored the "before" accuracy again)."""

from __future__ import annotations

import json
import time

from trl_groupopt.cli import main as cli


def _argv(out, *extra):
    return ["--output_dir", str(out), "--save_steps", "2", "--num_train_examples", "32",
            "--per_device_train_batch_size", "4", "--num_generations", "2", "--gradient_accumulation_steps", "1",
            "--steps_per_generation", "2", "--max_completion_length", "8", "--num_eval_examples", "8",
            "--heldout_eval_steps", "2", "--heldout_eval_examples", "4", *extra]  # fmt: skip


def test_a_resumed_run_reports_the_whole_run(tmp_path, capsys):
    out = tmp_path / "out"
    cli.train("grpo", _argv(out, "--max_steps", "2"))
    first = json.loads((out / "results.json").read_text())
    assert [step for step, _ in first["heldout_curve"]] == [0, 2]
    capsys.readouterr()
    started = time.perf_counter()
    cli.train("grpo", _argv(out, "--max_steps", "4", "--resume_from_checkpoint", "last"))
    second = time.perf_counter() - started
    said = capsys.readouterr().out
    whole = json.loads((out / "results.json").read_text())
    assert whole["accuracy_before"] == first["accuracy_before"]
    assert f"{first['accuracy_before']:.1%}, as measured before the run's first session" in said
    assert "prompts)...\n" not in said  # not measured again
    assert [step for step, _ in whole["heldout_curve"]] == [0, 2, 4]
    assert whole["heldout_curve"][:2] == first["heldout_curve"]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    earlier = state["stateful_callbacks"]["RunHistoryCallback"]["attributes"]["earlier_seconds"]
    assert 0 < earlier <= whole["wall_seconds"] <= earlier + second + 0.1 and whole["steps"] == 4


def test_the_same_command_again_over_its_finished_run_is_one_line_and_exit_0(tmp_path, capsys):
    """Issue 51, new user 3: the README's main command run a second time printed the refusal, a `RuntimeError`
    repeating it and accelerate's traceback (rc 1: `accelerate launch` turns any failure into its traceback). The
    same command over its own finished run now says so in one line and exits 0; another setting is still refused."""
    import pytest

    out = tmp_path / "out"
    argv = ["train", "--method", "grpo", *_argv(out, "--max_steps", "2", "--evaluate_accuracy", "false")]
    cli.main(argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    said = capsys.readouterr()
    assert exit_info.value.code == 0 and said.err == "" and said.out.count("\n") == 1
    assert said.out.startswith(f"The run is finished: {out} holds the final model and results of this same command")
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--learning_rate", "3e-4"])
    assert exit_info.value.code == 1 and "already holds checkpoints" in capsys.readouterr().err
