"""The example scripts run offline on CPU: `accelerate launch examples/train_<method>.py --max_steps 3` (the embedded
policy and the synthetic task), each DFPO transform and GRPO-fix, and `--config` YAML with `--use_peft`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.environment import REPO_ROOT as REPO
from tests.environment import process_environment

FAST = ["--max_steps", "3", "--logging_steps", "1", "--evaluate_accuracy", "false", "--num_train_examples", "64",
        "--report_to", "none"]  # fmt: skip
METRICS = {
    "echo": ["echo/batch_ratio", "echo/batch_clipped"],
    "dfpo": ["dfpo/asym_before", "dfpo/asym_after", "dfpo/shrink"],
    "ctpo": ["ctpo/dual_clip", "clip_ratio/region_mean"],
    "otb": ["otb/energy_mean", "otb/baseline_mean", "otb/adv_abs_mean"],
}


@pytest.mark.parametrize("method", sorted(METRICS))
def test_accelerate_launch_example(tmp_path, method):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", f"examples/train_{method}.py", *FAST,
           "--output_dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=process_environment(), capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    logged = {
        key for entry in json.loads((tmp_path / "trainer_state.json").read_text())["log_history"] for key in entry
    }
    for metric in METRICS[method]:
        assert metric in logged, (metric, sorted(logged))
    assert "step 1/3 | reward" in output and "{'loss'" not in output  # readable log lines, not dicts
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "results.json").exists()


@pytest.mark.parametrize("transform", ["min_replace", "orth_proj", "orth_proj_qp", "none", "symmetric_clip"])
def test_dfpo_example_every_transform(tmp_path, transform):
    from trl_groupopt.cli.main import train

    trainer = train("dfpo", [*FAST, "--dfpo_transform", transform, "--output_dir", str(tmp_path)])
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3
    expected = "clip_ratio/high_mean" if transform == "symmetric_clip" else "dfpo/shrink"
    assert all(expected in entry for entry in logged)


@pytest.mark.parametrize("method", sorted(METRICS))
def test_example_with_yaml_config_and_lora(tmp_path, method):
    from peft import PeftModel

    from trl_groupopt.cli.main import train

    argv = ["--config", f"examples/configs/{method}.yaml", "--use_peft", "--lora_r", "4", "--lora_alpha", "8",
            "--lora_target_modules", "q_proj", "v_proj", "--evaluate_accuracy", "false", "--num_train_examples", "64",
            "--output_dir", str(tmp_path)]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        trainer = train(method, argv)
    finally:
        os.chdir(cwd)
    assert isinstance(trainer.model, PeftModel)
    assert trainer.state.global_step == 3  # max_steps from the YAML file
    assert (tmp_path / "adapter_model.safetensors").exists()


def test_base_trainer_two_steps_on_embedded_policy(tmp_path):
    """The foundation's end-to-end check: the base trainer (TRL's GRPO objective through our loss path) trains the
    embedded policy for 2 steps, offline, on CPU."""
    import torch
    from safetensors.torch import load_file

    from trl_groupopt.cli.main import train
    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

    trainer = train("grpo", ["--max_steps", "2", "--logging_steps", "1", "--evaluate_accuracy", "false",
                             "--num_train_examples", "64", "--output_dir", str(tmp_path)])  # fmt: skip
    assert trainer.state.global_step == 2
    initial = load_file(f"{EMBEDDED_POLICY_PATH}/model.safetensors")
    trained = dict(trainer.model.named_parameters())
    assert any(not torch.equal(initial[name], trained[name].detach()) for name in initial if name in trained)
    assert all(torch.isfinite(p).all() for p in trained.values())
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all("clip_ratio/region_mean" in entry for entry in logged)
