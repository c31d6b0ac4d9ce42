"""A resumed run's ``results.json`` reports the whole run (issue 51, new user 5: it kept the held-out curve only from
the resume on and `wall_seconds` only for the resumed part, and the resumed run scored the "before" accuracy again)."""

from __future__ import annotations

import json

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
    cli.train("grpo", _argv(out, "--max_steps", "4", "--resume_from_checkpoint", "last"))
    said = capsys.readouterr().out
    whole = json.loads((out / "results.json").read_text())
    assert whole["accuracy_before"] == first["accuracy_before"]
    assert f"{first['accuracy_before']:.1%}, as measured before the run's first session" in said
    assert "prompts)...\n" not in said  # not measured again
    assert [step for step, _ in whole["heldout_curve"]] == [0, 2, 4]
    assert whole["heldout_curve"][:2] == first["heldout_curve"]
    assert whole["wall_seconds"] > first["wall_seconds"] and whole["steps"] == 4
