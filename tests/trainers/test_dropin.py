"""Drop-in: GRPOTrainer 1.16's public behaviours, run through every trainer of this library (CPU, offline).

- Constructor: the same signature and defaults as `GRPOTrainer.__init__`; positional and keyword calls; callbacks,
  optimizers, peft_config, processing_class, tools, rollout_func; with no reward source, TRL's own error.
- Environment-owned rewards: a tiny in-code environment (`CounterEnv`) whose `add` method is a tool and whose
  `get_reward` is the only reward. Every trainer trains 2 steps with it and no `reward_funcs`; the completions are
  multi-turn (assistant tool call, tool response, assistant answer), so TRL's `tool_mask` zeroes the tool tokens.
  OTB's raw rewards are checked against the environment's totals, DFPO's micro-batches hold whole groups.
- Loss types: the base trainer runs TRL's cispo / sapo / vespo with TRL's own `_compute_loss` (and its warnings).

The generation is scripted: a random tiny model never writes a parsable tool call, so `generate` is replaced by a
seeded script that either calls the tool (`add(x)`, x in 1..3) or answers at once, and answers "ok" after a tool
response. Everything after generation (tool execution, tool_mask, rewards, advantages, log-probs, loss, optimizer
step) is TRL's and the trainer's real code on the tiny model.
"""

from __future__ import annotations

import inspect
import json
import logging
import random
import re
from types import MethodType

import pytest
import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from tests.helpers import (
    compute_loss_and_grads,
    cpu_config_kwargs,
    inputs_with_policies,
    length_reward,
    random_batch,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from trl_groupopt import METHODS
from trl_groupopt.trainers import (
    GroupOptTrainer,
)

#: registry name -> (trainer, config, overrides selecting the mode), for every registered method
TRAINERS = {
    name: (spec.trainer_class, spec.config_class, dict(spec.config_defaults)) for name, spec in METHODS.items()
}
NO_REWARD_SOURCE = "No reward source provided"
# TRL flags environment_factory / rollout_func as experimental at every construction.
pytestmark = pytest.mark.filterwarnings("ignore:You are using .* experimental feature:UserWarning")


# ---------------------------------------------------------------- a tool-calling tokenizer, model and environment
_WORDS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
_CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def tool_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with Qwen2.5's chat template (tool calling; TRL knows its response parser)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    symbols = _CONTROL_TOKENS + _WORDS + [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    pattern = "|".join(re.escape(w) for w in sorted(_CONTROL_TOKENS + _WORDS, key=len, reverse=True)) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(_CONTROL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>",
        padding_side="left", chat_template=qwen2_5_chat_template, clean_up_tokenization_spaces=False,
    )  # fmt: skip


def tool_model(tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


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


class NoRewardEnv:
    """An environment with tools but no `get_reward`: not a reward source."""

    def reset(self, **kwargs) -> None:
        return None

    def noop(self) -> str:
        """Do nothing.

        Returns:
            An empty string.
        """
        return ""


def add(x: int) -> str:
    """Add a number (standalone tool).

    Args:
        x: The number to add.

    Returns:
        The number, as text.
    """
    return str(x)


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


def env_dataset(num_rows: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Count {i}."}] for i in range(num_rows)]})


def _config(name, tmp_path, **overrides):
    _, config_cls, mode = TRAINERS[name]
    return config_cls(**cpu_config_kwargs(tmp_path, **{**mode, **overrides}))


def _record_inputs(trainer) -> list[dict]:
    """Keep every micro-batch `_compute_loss` sees."""
    seen = []
    compute_loss = trainer._compute_loss

    def recording(self, model, inputs):
        seen.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        return compute_loss(model, inputs)

    trainer._compute_loss = MethodType(recording, trainer)
    return seen


# ---------------------------------------------------------------- constructor
GRPO_SIGNATURE = inspect.signature(GRPOTrainer.__init__)


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_signature_is_grpo_trainers(name):
    """Same parameters, in the same order, with the same defaults (so every GRPOTrainer call binds the same)."""
    ours = inspect.signature(TRAINERS[name][0].__init__).parameters
    theirs = GRPO_SIGNATURE.parameters
    assert list(ours) == list(theirs)
    for param in theirs.values():
        assert ours[param.name].default == param.default, param.name
        assert ours[param.name].kind == param.kind, param.name


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_no_reward_source_raises_trls_error(tmp_path, name):
    trainer_cls = TRAINERS[name][0]
    tokenizer = tiny_tokenizer()
    with pytest.raises(ValueError, match=NO_REWARD_SOURCE):
        trainer_cls(model=tiny_model(tokenizer), args=_config(name, tmp_path), train_dataset=tiny_dataset(16),
                    processing_class=tokenizer)  # fmt: skip
    tokenizer = tool_tokenizer()  # an environment without `get_reward` is not a reward source either
    with pytest.raises(ValueError, match=NO_REWARD_SOURCE):
        trainer_cls(model=tool_model(tokenizer), args=_config(name, tmp_path), train_dataset=env_dataset(),
                    processing_class=tokenizer, environment_factory=NoRewardEnv)  # fmt: skip


class _Flag(TrainerCallback):
    def __init__(self):
        self.began = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.began = True


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_keyword_arguments_reach_grpo_trainer(tmp_path, name):
    """callbacks, optimizers, peft_config, processing_class, tools: each takes effect as in GRPOTrainer; positional
    `(model, reward_funcs, args, train_dataset)` binds as in GRPOTrainer."""
    from peft import LoraConfig, PeftModel

    trainer_cls = TRAINERS[name][0]
    tokenizer = tool_tokenizer()
    model = tool_model(tokenizer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    callback = _Flag()
    trainer = trainer_cls(model, length_reward, _config(name, tmp_path), env_dataset(), processing_class=tokenizer,
                          callbacks=[callback], optimizers=(optimizer, scheduler), tools=[add])  # fmt: skip
    assert trainer.optimizer is optimizer and trainer.lr_scheduler is scheduler
    assert callback in trainer.callback_handler.callbacks
    assert trainer.processing_class is tokenizer and [t.__name__ for t in trainer.tools] == ["add"]
    assert [getattr(f, "__wrapped__", f) for f in trainer.reward_funcs] == [
        length_reward
    ]  # checked wrapper (checks.py)

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = trainer_cls(model=tool_model(tokenizer), reward_funcs=length_reward, args=_config(name, tmp_path),
                          train_dataset=env_dataset(), processing_class=tokenizer, peft_config=lora)  # fmt: skip
    assert isinstance(trainer.model, PeftModel)


# ---------------------------------------------------------------- environment-owned rewards, multi-turn tool masks
def _expected_env_reward(tokenizer, completion_ids) -> float:
    """The environment's total, read back from the completion: the x of the tool call, 0 without one."""
    text = tokenizer.decode(completion_ids)
    match = re.search(r'"arguments": \{"x": (\d)\}', text)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("name", sorted(TRAINERS))
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
        if trainer_cls.requires_whole_groups or trainer.whole_groups:
            group_ids = inputs["group_ids"]  # whole groups: each group's rows adjacent, all of them present
            assert torch.equal(torch.bincount(group_ids)[group_ids.unique()], torch.full_like(group_ids.unique(), 4))
        if trainer_cls.requires_raw_rewards:  # OTB: the environment's own rewards, raw (not centred, not scaled)
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


# ---------------------------------------------------------------- TRL's own loss types in the base trainer
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


@pytest.fixture(scope="module")
def trl_and_base(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    args = GRPOConfig(**cpu_config_kwargs(tmp_path_factory.mktemp("own_losses")))
    pair = []
    for trainer_cls in (GRPOTrainer, GroupOptTrainer):
        trainer = trainer_cls(tiny_model(tokenizer, seed=1), length_reward, args=args, train_dataset=tiny_dataset(16),
                              processing_class=tokenizer)  # fmt: skip
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        pair.append(trainer)
    return tokenizer, pair


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_base_loss_is_trls_for_its_own_loss_types(trl_and_base, loss_type):
    """Same loss, gradients and metrics as `GRPOTrainer._compute_loss`, off-policy, with a tool mask."""
    tokenizer, (trl_trainer, ours) = trl_and_base
    batch = random_batch(tokenizer, batch_size=6, seed=3, with_ref=False)
    batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
    batch["tool_mask"][:, 1:3] = 0
    results = []
    for trainer in (trl_trainer, ours):
        trainer.loss_type = loss_type
        trainer.args.loss_type = loss_type
        results.append(compute_loss_and_grads(trainer, inputs_with_policies(trainer, batch)))
    (trl_loss, trl_grads, trl_metrics), (our_loss, our_grads, our_metrics) = results
    assert torch.isfinite(trl_loss) and trl_loss.abs() > 0
    torch.testing.assert_close(our_loss, trl_loss, atol=0, rtol=0)
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], atol=0, rtol=0)
    assert our_metrics == trl_metrics


def test_trls_warning_for_sequence_level_cispo(tmp_path, caplog):
    """TRL's construction-time warning (sequence-level IS with a token-summed loss) reaches the user unchanged."""
    from transformers.utils import logging as hf_logging

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(**cpu_config_kwargs(tmp_path, loss_type="cispo", importance_sampling_level="sequence"))
    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            GroupOptTrainer(tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(16),
                            processing_class=tokenizer)  # fmt: skip
    finally:
        hf_logging.disable_propagation()
    assert "the `'cispo'` loss sums per-token contributions" in caplog.text


@pytest.mark.parametrize("name", sorted(set(TRAINERS) - {"grpo"}))
@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_methods_keep_rejecting_trls_own_loss_types(tmp_path, name, loss_type):
    trainer_cls = TRAINERS[name][0]
    assert trainer_cls.has_own_objective
    with pytest.raises(ValueError, match=rf"loss_type='{loss_type}' is not supported by {trainer_cls.__name__}"):
        trainer_cls.validate_args(_config(name, tmp_path, loss_type=loss_type))


def test_own_objective_flag_is_derived_for_subclasses():
    class SameLoss(GroupOptTrainer):
        pass

    class OwnAdvantages(GroupOptTrainer):
        def compute_advantages(self, inputs, per_token_logps, mask):
            return inputs["advantages"]

    assert not GroupOptTrainer.has_own_objective and not SameLoss.has_own_objective
    assert OwnAdvantages.has_own_objective
