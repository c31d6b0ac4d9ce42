"""Drop-in, end to end (CPU, offline): GRPOTrainer 1.16's training paths, run through every trainer of this library.

- Environment-owned rewards: a tiny in-code environment (`CounterEnv`) whose `add` method is a tool and whose
  `get_reward` is the only reward. Every trainer trains 2 steps with it and no `reward_funcs`; the completions are
  multi-turn (assistant tool call, tool response, assistant answer), so TRL's `tool_mask` zeroes the tool tokens.
  OTB's raw rewards are checked against the environment's totals, DFPO's micro-batches hold whole groups.
- `rollout_func` with an `env_mask`; the base trainer trains with TRL's cispo / sapo / vespo.

The generation is scripted: a random tiny model never writes a parsable tool call, so `generate` is replaced by a
seeded script that either calls the tool (`add(x)`, x in 1..3) or answers at once, and answers "ok" after a tool
response. Everything after generation (tool execution, tool_mask, rewards, advantages, log-probs, loss, optimizer
step) is TRL's and the trainer's real code on the tiny model (tokenizer and model: tests/trainers/test_dropin.py).
"""

from __future__ import annotations

import json
import random
import re
from types import MethodType

import pytest
import torch
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from tests.trainers.test_dropin import TRAINERS, _config, env_dataset, tool_model, tool_tokenizer
from trl_groupopt import GroupOptTrainer

# TRL flags environment_factory / rollout_func as experimental at every construction.
pytestmark = pytest.mark.filterwarnings("ignore:You are using .* experimental feature:UserWarning")


class CounterEnv:
    """Owns its reward: the sum of the numbers the policy added with the `add` tool during the rollout."""

    def reset(self, **kwargs) -> None:
        self.total = 0

    def add(self, x: int) -> str:
        """Add a number to the counter.

        Args:
            x: The number to add.

        Returns:
            The counter after the addition.
        """
        self.total += int(x)
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total)


def tool_call_text(x: int) -> str:
    return "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"x": x}}) + "\n</tool_call>"


def script_generation(model, tokenizer, seed: int = 0) -> None:
    """Replace `model.generate` by a seeded script: first turn a tool call (3 in 4) or an answer, "ok" after a tool
    response. Returns prompt + completion ids, padded, as `generate` does."""
    rng = random.Random(seed)
    response_id = tokenizer.convert_tokens_to_ids("<tool_response>")

    def generate(input_ids, attention_mask=None, generation_config=None, **kwargs):
        completions = []
        for row in input_ids.tolist():
            if response_id in row:
                text = "ok"
            else:
                text = tool_call_text(rng.randint(1, 3)) if rng.random() < 0.75 else "no"
            completions.append(tokenizer.encode(text + tokenizer.eos_token, add_special_tokens=False))
        width = max(len(c) for c in completions)
        out = torch.full((len(completions), width), tokenizer.pad_token_id, dtype=input_ids.dtype)
        for i, ids in enumerate(completions):
            out[i, : len(ids)] = torch.tensor(ids)
        return torch.cat([input_ids, out.to(input_ids.device)], dim=1)

    model.generate = generate


def _record_inputs(trainer) -> list[dict]:
    """Keep every micro-batch `_compute_loss` sees."""
    seen = []
    compute_loss = trainer._compute_loss

    def recording(self, model, inputs):
        seen.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        return compute_loss(model, inputs)

    trainer._compute_loss = MethodType(recording, trainer)
    return seen


# ---------------------------------------------------------------- environment-owned rewards, multi-turn tool masks
def _expected_env_reward(tokenizer, completion_ids) -> float:
    """The environment's total, read back from the completion: the x of the tool call, 0 without one."""
    text = tokenizer.decode(completion_ids)
    match = re.search(r'"arguments": \{"x": (\d)\}', text)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("name", sorted(tested_methods()))
def test_environment_owned_reward_trains_two_steps(tmp_path, name):
    """The acceptance call: `Trainer(model=..., args=..., train_dataset=..., environment_factory=Env)`, no
    `reward_funcs`; multi-turn completions with tool tokens masked out of the loss."""
    trainer_cls = TRAINERS[name][0]
    tokenizer = tool_tokenizer()
    model = tool_model(tokenizer)
    script_generation(model, tokenizer, seed=0)
    args = _config(name, tmp_path, max_completion_length=128)
    trainer = trainer_cls(model=model, args=args, train_dataset=env_dataset(), processing_class=tokenizer,
                          environment_factory=CounterEnv)  # fmt: skip
    assert trainer.reward_func_names == ["CounterEnv"]
    seen = _record_inputs(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()

    assert trainer.state.global_step == 2 and len(seen) == 2
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 0.0
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all(torch.isfinite(torch.tensor(e["loss"])) for e in logged)
    assert any(e["rewards/CounterEnv/mean"] > 0 for e in logged)
    assert sum(e.get("tools/call_frequency", 0) for e in logged) > 0  # logged on generation steps

    for inputs in seen:
        # Multi-turn: the tool response tokens are inside the completion and masked out (tool_mask 0 there).
        tool_mask, completion_mask = inputs["tool_mask"], inputs["completion_mask"]
        called = [_expected_env_reward(tokenizer, ids) > 0 for ids in inputs["completion_ids"].tolist()]
        for row, has_call in enumerate(called):
            masked_out = ((tool_mask[row] == 0) & (completion_mask[row] == 1)).sum().item()
            assert (masked_out > 0) == has_call, (row, masked_out)
        if trainer.whole_groups:  # the config decides (DFPO's GRPO-fix mode needs no whole groups)
            group_ids = inputs["group_ids"]  # whole groups: each group's rows adjacent, all of them present
            assert torch.equal(torch.bincount(group_ids)[group_ids.unique()], torch.full_like(group_ids.unique(), 4))
        if trainer.estimator.needs_raw_rewards:  # OTB: the environment's own rewards, raw (not centred, not scaled)
            expected = [_expected_env_reward(tokenizer, ids) for ids in inputs["completion_ids"].tolist()]
            torch.testing.assert_close(inputs["rewards"], torch.tensor(expected))


@pytest.mark.parametrize("name", ["grpo", "otb"])
def test_rollout_func_with_env_mask(tmp_path, name):
    """TRL's `rollout_func` path: the rollout returns its own token ids and an `env_mask` (TRL's tool_mask)."""
    trainer_cls = TRAINERS[name][0]
    tokenizer = tiny_tokenizer()
    masks = []

    def rollout_func(prompts, trainer):
        rows, completions, logprobs, env_mask = [], [], [], []
        rng = random.Random(len(masks))
        for prompt in prompts:
            prompt_ids = tokenizer.encode(prompt if isinstance(prompt, str) else prompt[-1]["content"])
            n_model, n_env = rng.randint(1, 3), rng.randint(1, 3)  # one completion per row (rows repeat the prompt)
            ids = [rng.randint(10, len(tokenizer) - 1) for _ in range(2 * n_model + n_env)]
            rows.append(prompt_ids)
            completions.append(ids)
            logprobs.append([0.0] * len(ids))
            env_mask.append([1] * n_model + [0] * n_env + [1] * n_model)
        masks.extend(env_mask)
        return {"prompt_ids": rows, "completion_ids": completions, "logprobs": logprobs, "env_mask": env_mask}

    trainer = trainer_cls(tiny_model(tokenizer), length_reward, args=_config(name, tmp_path),
                          train_dataset=tiny_dataset(16), processing_class=tokenizer, rollout_func=rollout_func)  # fmt: skip
    seen = _record_inputs(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert all((inputs["tool_mask"] == 0).any() for inputs in seen)
    if name == "otb":  # the raw rewards are length_reward's, on the decoded completions
        for inputs in seen:
            assert torch.isfinite(inputs["rewards"]).all() and inputs["rewards"].std() > 0


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_base_trains_with_trls_own_loss_types(tmp_path, loss_type):
    tokenizer = tiny_tokenizer()
    args = GRPOConfig(**cpu_config_kwargs(tmp_path, loss_type=loss_type))
    trainer = GroupOptTrainer(tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(16),
                              processing_class=tokenizer)  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters()) > 0
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    metric = {"cispo": "cispo_clip_ratio", "vespo": "vespo/phi_seq_mean", "sapo": "entropy"}[loss_type]
    assert all(metric in entry for entry in logged)
    assert not any(key.startswith("clip_ratio/") for entry in logged for key in entry)  # TRL's metrics, not ours
