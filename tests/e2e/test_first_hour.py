"""The first hour of a new user (issue 16), the parts that train or launch a process: the example script's help, the
README snippet in a fresh process, training with rewards that never score or are not numbers, and what the demo leaves
behind (the checks that need neither: tests/test_first_hour.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.environment import REPO_ROOT as REPO
from tests.environment import process_environment
from tests.test_first_hour import _tiny_args
from trl_groupopt import ECHOTrainer
from trl_groupopt.cli import main as cli
from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH, make_arithmetic_dataset
from trl_groupopt.data.rewards import accuracy_reward


@pytest.fixture(scope="module")
def arithmetic():
    return make_arithmetic_dataset(8)


def test_example_script_help_shows_method_knobs():
    proc = subprocess.run([sys.executable, "examples/train_otb.py", "--help"], cwd=REPO, env=process_environment(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--otb_handle_zero_tail" in proc.stdout and "--max_steps" in proc.stdout


def readme_snippet() -> str:
    """The README's first Python block: the snippet a new user copies."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_readme_snippet_runs_on_cpu(tmp_path):
    """The README's runnable snippet, verbatim, in a fresh process with no GPU settings: bf16 is picked off."""
    snippet = readme_snippet()
    assert "EMBEDDED_POLICY_PATH" in snippet and "use_cpu" not in snippet and "bf16" not in snippet
    env = process_environment()
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "tiny-ECHO").is_dir()
    assert "save_steps=500 saves inside a generation cycle" not in proc.stderr  # issue 46: no checkpoint before step 5


def test_training_with_a_reward_that_is_always_none_stops_before_any_checkpoint(tmp_path, arithmetic):
    def always_none(completions, **kwargs):
        return [None] * len(completions)

    args = _tiny_args(tmp_path, max_steps=5, save_strategy="steps", save_steps=3, max_all_none_reward_batches=2)
    trainer = ECHOTrainer(model=EMBEDDED_POLICY_PATH, reward_funcs=always_none, args=args, train_dataset=arithmetic)
    with pytest.warns(UserWarning, match="always_none"), pytest.raises(RuntimeError, match="No reward"):
        trainer.train()
    assert trainer.state.global_step < 3
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_non_numeric_reward_in_training_names_the_function(tmp_path, arithmetic):
    def words(completions, **kwargs):
        return ["good"] * len(completions)

    trainer = ECHOTrainer(model=EMBEDDED_POLICY_PATH, reward_funcs=[accuracy_reward, words],
                          args=_tiny_args(tmp_path), train_dataset=arithmetic)  # fmt: skip
    assert trainer.reward_func_names == ["accuracy_reward", "words"]
    with pytest.raises(TypeError, match="'words' returned str 'good'"):
        trainer.train()


def test_demo_output_folder_has_model_card_state_plot_and_results(tmp_path, capsys):
    out = tmp_path / "demo"
    cli.train("echo", ["--max_steps", "2", "--logging_steps", "1", "--num_train_examples", "32",
                       "--num_eval_examples", "8", "--output_dir", str(out)])  # fmt: skip
    for name in ("model.safetensors", "config.json", "README.md", "trainer_state.json", "reward_accuracy.png",
                 "results.json", "tokenizer.json"):  # fmt: skip
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 2 and 0 <= results["accuracy_before"] <= 1 and 0 <= results["accuracy_after"] <= 1
    assert results["wall_seconds"] > 0
    assert (out / "reward_accuracy.png").stat().st_size > 5000  # axes, lines and markers, not a blank canvas
    printed = capsys.readouterr().out
    assert "step 1/2 | reward" in printed and "echo/batch_clipped" in printed  # readable lines, headline metric
    assert "{'loss'" not in printed  # no raw dicts
