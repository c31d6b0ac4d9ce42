"""Runs that survive (issue 29), end to end on CPU: divergence, resume, rewards as GRPOTrainer takes them, drop-in.

- `learning_rate=1e8` (`DIVERGING_LR`) under every method's default schedule ends with the non-finite guard's error naming the step,
  and no file in `output_dir` holds a NaN or inf; `nonfinite_guard=False` trains on as transformers does.
- A truncated newest checkpoint, or one zeroed at its size: `train(resume_from_checkpoint=True)` warns, resumes from the previous one and ends
  where the uninterrupted run ends.
- The CLI: a run interrupted with SIGINT after a checkpoint, resumed with `--resume_from_checkpoint last`, ends with
  the uninterrupted run's weights, bit for bit; the checkpoint it resumed from is untouched. (Issue 46's kills and
  SIGTERM: tests/e2e/test_resume_damage.py.)
- A group whose rewards are all equal trains nothing, in every method's trained objective.
- Reward forms GRPOTrainer accepts train; an infinite reward stops at the first batch; all-NaN rewards stop saying
  NaN; with TRL's plain `GRPOConfig` all-None batches warn and training goes on, as in GRPOTrainer; a dataset without
  a `prompt` column trains with a dict of environments whose `reset()` supplies the prompt, as in GRPOTrainer.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from trl import GRPOConfig, GRPOTrainer

from tests.e2e.test_dropin_training import CounterEnv, script_generation
from tests.environment import REPO_ROOT, process_environment
from tests.helpers import (
    assert_registered,
    clone_model,
    cpu_config_kwargs,
    method_trainer,
    tiny_model,
    tiny_tokenizer,
)
from tests.selection import tested_methods
from tests.trainers.test_dropin import _config, tool_model, tool_tokenizer
from trl_groupopt import ECHOTrainer, GroupOptTrainer

#: `trl_groupopt.runfolder.checkpoints`'s names, spelled out so that this module also runs against code without them
CHECKPOINT_RECORD, LOCK_NAME = "trl_groupopt_checkpoint.json", "_trl_groupopt.lock"


#: A learning rate at which every method's tiny run reaches a NaN within a few steps. At 100, AdamW's first steps
#: saturate the ratios instead (measured with torch 2.13 and transformers 5.24: losses near 1e25, a zero gradient norm,
#: all finite), so the guard rightly stays silent there; at 1e8 the logits overflow.
DIVERGING_LR = 1e8


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=3)


def _tensors(value):
    """Every tensor in a (nested) loaded object."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _nonfinite_files(folder: Path) -> list[str]:
    """Files under `folder` holding a floating-point NaN or inf (weights, optimizer states, anything torch loads)."""
    bad = []
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".safetensors":
            loaded = load_file(str(path))
        elif path.suffix in (".pt", ".pth", ".bin"):
            loaded = torch.load(path, weights_only=False)
        else:
            continue
        if any(t.is_floating_point() and not torch.isfinite(t).all() for t in _tensors(loaded)):
            bad.append(str(path.relative_to(folder)))
    return bad


# ------------------------------------------------------------------------------------------------ the guard
@pytest.mark.parametrize("name", tested_methods())
def test_divergence_stops_before_any_nonfinite_weight_is_saved(tmp_path, tiny, name):
    """Each method's default schedule (ECHO and CTPO off-policy), a checkpoint every step: the run stops with the
    guard's error naming the step, the metric and the causes; every file on disk is finite; the checkpoints saved
    before are complete."""
    from trl_groupopt.trainer.guard import NonFiniteError

    tokenizer, model = tiny
    trainer = method_trainer(name, tmp_path, clone_model(model), tokenizer, num_examples=256, learning_rate=DIVERGING_LR,
                             max_steps=8, save_strategy="steps", save_steps=1, disable_tqdm=True)  # fmt: skip
    with pytest.raises(NonFiniteError) as stopped:
        trainer.train()
    message = str(stopped.value)
    step = trainer.state.global_step + 1
    assert f"Training diverged at step {step}: the " in message
    assert (
        "gradient norm is nan" in message or "gradient norm is inf" in message
    ) or "loss of a micro-batch" in message
    assert f"learning_rate={DIVERGING_LR}" in message and "rewards" in message and "checkpoint-" in message
    assert _nonfinite_files(tmp_path) == []
    saved = sorted(tmp_path.glob("checkpoint-*"))
    assert len(saved) == trainer.state.global_step  # one per applied step, none after the divergence
    assert all((folder / CHECKPOINT_RECORD).is_file() for folder in saved)
    assert not (tmp_path / "model.safetensors").exists() and not (tmp_path / LOCK_NAME).exists()


def test_guard_off_trains_on_as_transformers_does(tmp_path, tiny):
    """`nonfinite_guard=False`: ECHO's default schedule at `DIVERGING_LR` returns normally with non-finite weights (the
    behaviour the guard prevents), and saving them is allowed."""
    tokenizer, model = tiny
    trainer = method_trainer("echo", tmp_path, clone_model(model), tokenizer, num_examples=256, learning_rate=DIVERGING_LR,
                             max_steps=4, nonfinite_guard=False, logging_nan_inf_filter=False)  # fmt: skip
    trainer.train()
    assert any(not torch.isfinite(p).all() for p in trainer.model.parameters())
    grad_norms = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    assert any(not math.isfinite(g) for g in grad_norms)
    trainer.save_model(str(tmp_path / "final"))
    assert _nonfinite_files(tmp_path / "final") == ["model.safetensors"]


# ------------------------------------------------------------------------------------------------ resume
def _resume_trainer(tiny, output_dir, max_steps=6):
    tokenizer, model = tiny
    return method_trainer("echo", output_dir, clone_model(model), tokenizer, num_examples=64, max_steps=max_steps,
                          per_device_train_batch_size=4, num_generations=2, steps_per_generation=4,
                          gradient_accumulation_steps=2, save_strategy="steps", save_steps=2,
                          disable_tqdm=True)  # fmt: skip


def _truncate(path: Path) -> str:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    return "model.safetensors is "


def _zero_tail(path: Path) -> str:
    """The last quarter of the file zeroed in place, its size kept (issue 38: a power loss, a preallocating copy)."""
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(size - size // 4)
        handle.write(b"\0" * (size // 4))
    return "model.safetensors has the recorded size but not the recorded content"


@pytest.mark.parametrize("damage", [_truncate, _zero_tail], ids=["truncated", "zeroed"])
def test_a_damaged_newest_checkpoint_is_skipped_and_resume_falls_back(tmp_path, tiny, damage):
    """checkpoint-6 (the newest) loses the end of its weights file, or has it zeroed at the same size: resume warns
    naming it and what is wrong, loads checkpoint-4, and ends with the uninterrupted run's weights."""
    full = _resume_trainer(tiny, tmp_path)
    full.train()
    final = {n: p.detach().clone() for n, p in full.model.named_parameters()}
    expected = damage(tmp_path / "checkpoint-6" / "model.safetensors")
    resumed = _resume_trainer(tiny, tmp_path)
    loaded, load = [], resumed._load_from_checkpoint
    resumed._load_from_checkpoint = lambda folder, *args, **kwargs: (
        loaded.append(folder) or load(folder, *args, **kwargs)
    )
    with pytest.warns(UserWarning, match=rf"Skipping the incomplete or damaged checkpoint .*checkpoint-6: {expected}"):
        resumed.train(resume_from_checkpoint=True)
    assert loaded == [str(tmp_path / "checkpoint-4")] and resumed.state.global_step == 6
    for name, value in final.items():
        assert torch.equal(resumed.model.get_parameter(name).detach(), value), name
    assert CHECKPOINT_RECORD in os.listdir(tmp_path / "checkpoint-6")  # rewritten whole


def _cli_args(output_dir: Path, *extra: str) -> list[str]:
    return ["--output_dir", str(output_dir), "--max_steps", "4", "--save_steps", "2", "--num_train_examples", "64",
            "--evaluate_accuracy", "false", "--logging_steps", "1", *extra]  # fmt: skip


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def test_cli_interrupted_after_a_checkpoint_resumes_bit_identically(tmp_path, capsys):
    """The acceptance run: the demo (embedded policy, ECHO) for 4 steps with a checkpoint every 2. Interrupted
    (SIGINT) in its own process once checkpoint-2 is complete, and resumed with `--resume_from_checkpoint last`, it
    ends with the uninterrupted run's weights, bit for bit, and leaves checkpoint-2 as it was. (The uninterrupted and
    the resumed run train in this process: one interpreter start instead of three.)"""
    from trl_groupopt.cli import main as cli
    from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

    started = time.perf_counter()
    cli.train("echo", _cli_args(tmp_path / "full"))
    full_s = time.perf_counter() - started

    out = tmp_path / "interrupted"
    started = time.perf_counter()
    command = [sys.executable, "-m", "trl_groupopt.cli", "train", "--method", "echo", *_cli_args(out)]
    run = subprocess.Popen(command, env=process_environment(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)  # fmt: skip
    record = out / "checkpoint-2" / CHECKPOINT_RECORD
    while not record.exists() and run.poll() is None and time.perf_counter() - started < 300:
        time.sleep(0.02)
    interrupted_at = time.perf_counter() - started
    run.send_signal(signal.SIGINT)
    log = run.communicate(timeout=120)[0].decode(errors="replace")
    assert run.returncode == 130, log  # interrupted, not finished: one line naming the resume command
    assert "Traceback" not in log and log.strip().splitlines()[-1].endswith("--resume_from_checkpoint last")
    assert not (out / "model.safetensors").exists() and not (out / LOCK_NAME).exists()
    kept = _digest(out / "checkpoint-2")

    capsys.readouterr()
    started = time.perf_counter()
    cli.train("echo", _cli_args(out, "--resume_from_checkpoint", "last"))
    resume_s = time.perf_counter() - started
    assert f"resuming from {out / 'checkpoint-'}" in capsys.readouterr().out
    expected, got = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    initial = load_file(os.path.join(EMBEDDED_POLICY_PATH, "model.safetensors"))
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    assert any(not torch.equal(initial[name], value) for name, value in expected.items())  # it did train
    assert _digest(out / "checkpoint-2") == kept  # the checkpoint resumed from: the same bytes
    with capsys.disabled():
        print(f"\nuninterrupted {full_s:.1f} s; interrupted after {interrupted_at:.1f} s; resumed {resume_s:.1f} s")


# ------------------------------------------------------------------------------------------------ equal rewards
#: registry name -> why the method keeps TRL's advantages for an equal-reward group
KEEPS_TRL_ADVANTAGES = {"grpo": "the base trainer is GRPOTrainer's objective, advantages included"}


def test_keeps_trl_advantages_names_registered_methods():
    assert_registered(KEEPS_TRL_ADVANTAGES, "KEEPS_TRL_ADVANTAGES")


@pytest.mark.parametrize("name", [name for name in tested_methods() if name not in KEEPS_TRL_ADVANTAGES])
def test_a_group_of_equal_rewards_trains_nothing(tmp_path, tiny, name):
    """Every reward 0.1 in groups of 8 (TRL's float32 group mean leaves advantages of ~7e-5 there; OTB's energy
    weights left up to the raw reward): one step under the method's defaults has loss 0, gradient norm 0 and moves
    no weight."""
    tokenizer, model = tiny
    trainer = method_trainer(name, tmp_path, clone_model(model), tokenizer, lambda completions, **kw: [0.1] * len(completions),
                             num_examples=128, per_device_train_batch_size=8, num_generations=8, max_steps=1,
                             disable_tqdm=True)  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    (logged,) = [e for e in trainer.state.log_history if "loss" in e]
    assert logged["loss"] == 0.0 and logged["grad_norm"] == 0.0, logged
    for n, value in before.items():
        assert torch.equal(trainer.model.get_parameter(n).detach(), value), n


# ------------------------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize(
    "form",
    [lambda n: np.array([np.bool_(i % 2) for i in range(n)]), lambda n: np.arange(n, dtype=np.float64) / n,
     lambda n: torch.arange(n) % 3 == 0, lambda n: torch.linspace(0, 1, n)],
    ids=["numpy bools", "numpy array", "bool tensor", "float tensor"],
)  # fmt: skip
def test_reward_forms_grpo_trainer_accepts_train(tmp_path, tiny, form):
    tokenizer, model = tiny
    trainer = method_trainer("echo", tmp_path, clone_model(model), tokenizer, lambda completions, **kw: form(len(completions)),
                             max_steps=1)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1


def test_an_infinite_reward_stops_the_first_batch(tmp_path, tiny):
    tokenizer, model = tiny

    def overflowing(completions, **kwargs):
        return [1.0, float("-inf")] + [1.0] * (len(completions) - 2)

    trainer = method_trainer("otb", tmp_path, clone_model(model), tokenizer, overflowing, max_steps=2)
    with pytest.raises(ValueError, match=r"'overflowing' returned -inf for completion 1 of the generation batch"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_all_nan_rewards_stop_saying_nan(tmp_path, tiny):
    tokenizer, model = tiny
    trainer = method_trainer("ctpo", tmp_path, clone_model(model), tokenizer,
                             lambda completions, **kw: [float("nan")] * len(completions), max_steps=4,
                             steps_per_generation=1)  # fmt: skip
    with pytest.warns(UserWarning, match="returned None or NaN"), pytest.raises(RuntimeError, match="None or NaN"):
        trainer.train()


def test_plain_grpo_config_all_none_batches_warn_and_training_goes_on(tmp_path, tiny):
    """GRPOTrainer warns about a batch without rewards and trains on (zero advantages); so does the base trainer with
    TRL's GRPOConfig. The method configs and the CLI stop (test_all_nan_rewards_stop_saying_nan)."""
    tokenizer, model = tiny
    args = GRPOConfig(**cpu_config_kwargs(tmp_path, max_steps=3))
    for trainer_cls in (GRPOTrainer, GroupOptTrainer):
        trainer = trainer_cls(clone_model(model), lambda completions, **kw: [None] * len(completions), args=args,
                              train_dataset=Dataset.from_dict({"prompt": ["1+1=?"] * 16}),
                              processing_class=tokenizer)  # fmt: skip
        if trainer_cls is GroupOptTrainer:
            with pytest.warns(UserWarning, match="returned None or NaN") as caught:
                trainer.train()
            assert sum("returned None or NaN" in str(w.message) for w in caught) == 3  # one per generation batch
        else:
            trainer.train()
        assert trainer.state.global_step == 3, trainer_cls


# ------------------------------------------------------------------------------------------------ drop-in
class PromptingCounterEnv(CounterEnv):
    """Owns the data: `reset()` supplies the prompt (the dataset has no `prompt` column)."""

    def reset(self, **kwargs) -> str:
        super().reset(**kwargs)
        return "Add a number with the tool."


@pytest.mark.filterwarnings("ignore:You are using .* experimental feature:UserWarning")
@pytest.mark.parametrize("trainer_cls", [GRPOTrainer, GroupOptTrainer, ECHOTrainer], ids=lambda c: c.__name__)
def test_a_dict_of_environments_supplies_the_prompts(tmp_path, trainer_cls):
    """TRL 1.16 trains on a dataset with only an `environment` column routing rows to a dict of environments; so do
    our trainers (the construction check no longer asks for a `prompt` column there)."""
    tokenizer = tool_tokenizer()
    model = tool_model(tokenizer)
    script_generation(model, tokenizer, seed=0)
    name = "echo" if trainer_cls is ECHOTrainer else "grpo"
    args = _config(name, tmp_path, max_completion_length=128, max_steps=2)
    data = Dataset.from_dict({"environment": ["counter", "counter_b"] * 8})
    trainer = trainer_cls(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                          environment_factory={"counter": PromptingCounterEnv, "counter_b": PromptingCounterEnv})  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(e.get("rewards/PromptingCounterEnv/mean", 0) > 0 for e in trainer.state.log_history)


def test_the_record_and_lock_names_are_the_library_s():
    from trl_groupopt.runfolder import checkpoints, lock

    assert (checkpoints.CHECKPOINT_RECORD, lock.LOCK_NAME) == (CHECKPOINT_RECORD, LOCK_NAME)
