"""Drop-in: GRPOTrainer 1.16's public behaviours, run through every trainer of this library (CPU, offline).

- Constructor: the same signature and defaults as `GRPOTrainer.__init__`; positional and keyword calls; callbacks,
  optimizers, peft_config, processing_class, tools, rollout_func; with no reward source, TRL's own error.
- Loss types: the base trainer's loss, gradients and metrics for TRL's cispo / sapo / vespo are TRL's own
  `_compute_loss`'s (and its warnings); the method trainers reject them.

The tool-calling tokenizer, model and dataset here are shared with the training runs of
tests/e2e/test_dropin_training.py (environment-owned rewards, `rollout_func`, TRL's loss types in a 2-step run).
"""

from __future__ import annotations

import inspect
import logging
import re

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
from tests.selection import tested_methods
from trl_groupopt import METHODS, GroupOptTrainer

#: registry name -> (trainer, config, overrides), for every registered method
TRAINERS = {name: (spec.trainer_class, spec.config_class, {}) for name, spec in METHODS.items()}
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


def env_dataset(num_rows: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Count {i}."}] for i in range(num_rows)]})


def _config(name, tmp_path, **overrides):
    _, config_cls, mode = TRAINERS[name]
    return config_cls(**cpu_config_kwargs(tmp_path, **{**mode, **overrides}))


# ---------------------------------------------------------------- constructor
GRPO_SIGNATURE = inspect.signature(GRPOTrainer.__init__)


@pytest.mark.parametrize("name", sorted(tested_methods()))
def test_signature_is_grpo_trainers(name):
    """Same parameters, in the same order, with the same defaults (so every GRPOTrainer call binds the same)."""
    ours = inspect.signature(TRAINERS[name][0].__init__).parameters
    theirs = GRPO_SIGNATURE.parameters
    assert list(ours) == list(theirs)
    for param in theirs.values():
        assert ours[param.name].default == param.default, param.name
        assert ours[param.name].kind == param.kind, param.name


@pytest.mark.parametrize("name", sorted(tested_methods()))
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


@pytest.mark.parametrize("name", sorted(tested_methods()))
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


# ---------------------------------------------------------------- TRL's own loss types in the base trainer
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


@pytest.mark.parametrize("name", sorted(set(tested_methods()) - {"grpo"}))
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
