"""OTBTrainer in the settings users run: tool masks, environment-owned rewards, off-policy batches, LoRA.

- The energy each log-prob forward records beside its log-probs (TRL's fused head, `log_sum_sq_probs`) equals
  1 - 2 p_y + sum_v p_v^2 from the full logits of the right policy: the behaviour policy for `old_per_token_energy`
  (also under LoRA, where TRL's reference forward runs through the same module with the adapter off), and whatever
  module wrapper TRL passes in (no identity of the module, no hooks).
- Knob wiring: on one off-policy tool-use batch (from a `rollout_func`'s `env_mask`, rewards from an environment's
  `get_reward`, `reward_funcs=None`), the advantages the loss uses equal `otb_advantages` with the configured
  `otb_handle_zero_tail` / `otb_token_positions`, and changing either knob changes the advantages and the loss.
"""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import FusedCausalLMOutput

from tests.helpers import (
    clone_model,
    compute_loss_and_grads,
    cpu_config_kwargs,
    length_reward,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from tests.objectives.groups import groups_of
from trl_groupopt import OTBConfig, OTBTrainer
from trl_groupopt.core.estimators import EstimatorInputs
from trl_groupopt.methods.otb.objective import logit_gradient_energy, otb_advantages, otb_zero_tail

TEMPERATURE = 0.7
# The in-code tokenizer's template plus tool calls and tool messages: TRL requires a template that renders a full
# tool-calling conversation whenever `environment_factory` is given.
TOOL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<|user|>' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] }}"
    "{%- for call in (message.get('tool_calls') or []) %}"
    "{{ call['function']['name'] + (call['function']['arguments'] | tojson) }}{%- endfor %}"
    "{{ eos_token + '\\n' }}"
    "{%- elif message['role'] == 'tool' %}{{ '<|user|>' + message['content'] + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{%- endif %}"
)
# Per row of a group: completion length and the tool-result span (env_mask 0) inside it. Valid-token counts 6, 5, 4, 3:
# one unique longest member (the zero tail acts) and holes at different columns (the positions knob acts).
ROLLOUT_SHAPES = [(8, (2, 4)), (5, None), (7, (1, 4)), (4, (3, 4))]


class ScoredEnv:
    """An environment that owns the reward: `get_reward` returns a score fixed at `reset` (0, 1, 2, 0, ...)."""

    resets = 0

    def reset(self, **kwargs):
        type(self).resets += 1
        self.score = float(type(self).resets % 3)

    def get_reward(self) -> float:
        return self.score


def fixed_rollout(prompts, trainer):
    """A `rollout_func`: fixed completions with an `env_mask` (TRL turns it into `tool_mask`)."""
    tok = trainer.processing_class
    gen = torch.Generator().manual_seed(0)
    prompt_ids, completion_ids, logprobs, env_mask = [], [], [], []
    for i, prompt in enumerate(prompts):
        text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        prompt_ids.append(tok(text, add_special_tokens=False)["input_ids"])
        length, hole = ROLLOUT_SHAPES[i % len(ROLLOUT_SHAPES)]
        ids = torch.randint(10, len(tok), (length,), generator=gen).tolist()
        ids[-1] = tok.eos_token_id
        mask = [1] * length
        if hole is not None:
            mask[hole[0] : hole[1]] = [0] * (hole[1] - hole[0])
        completion_ids.append(ids)
        logprobs.append([0.0] * length)
        env_mask.append(mask)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": env_mask}


def make_tool_tokenizer():
    """The in-code tokenizer with `TOOL_CHAT_TEMPLATE`."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def tool_tokenizer():
    return make_tool_tokenizer()


@pytest.fixture(scope="module")
def base_model(tool_tokenizer):
    return tiny_model(tool_tokenizer)


def _config(tmp_path, name, **overrides):
    # steps_per_generation 2 with accumulation 1: TRL runs the behaviour forward (off-policy batch)
    kwargs = dict(per_device_train_batch_size=4, num_generations=4, steps_per_generation=2, temperature=TEMPERATURE)
    kwargs.update(overrides)
    return OTBConfig(**cpu_config_kwargs(tmp_path / name, **kwargs))


def _env_trainer(tmp_path, name, model, tokenizer, reward_funcs=None, **overrides):
    return OTBTrainer(
        model=clone_model(model),
        reward_funcs=reward_funcs,
        args=_config(tmp_path, name, **overrides),
        train_dataset=tiny_dataset(8),
        processing_class=tokenizer,
        environment_factory=ScoredEnv,
        rollout_func=fixed_rollout,
    )


def _rows(trainer):
    return [trainer.train_dataset[i] for i in (0, 0, 0, 0, 1, 1, 1, 1)]


def _full_logits_energy(model, batch, temperature=TEMPERATURE) -> torch.Tensor:
    """(B, T) energy from the model's full (B, T, V) logits, float64: the independent reference."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
    length = batch["completion_ids"].shape[1]
    return logit_gradient_energy(logits[:, -length:].double(), input_ids[:, -length:], temperature=temperature)


def _loss_and_advantages(trainer, batch):
    """The loss of one micro-batch and the advantages its objective received."""
    seen = {}
    objective = trainer.objective

    def recording_objective(per_token_logps, old_per_token_logps, advantages, mask, inputs):
        seen["advantages"] = advantages.detach().clone()
        return objective(per_token_logps, old_per_token_logps, advantages, mask, inputs)

    trainer.objective = recording_objective
    trainer.current_gradient_accumulation_steps = 1  # set by `Trainer.train`; one micro-batch per step here
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    return loss.detach(), seen["advantages"]


def test_environment_rewards_and_tool_mask_reach_the_otb_advantages(tmp_path, tool_tokenizer, base_model):
    """reward_funcs=None, rewards from the environment's `get_reward`, holes from `env_mask`: the batch carries the raw
    environment rewards, the tool mask and the behaviour policy's energy; each knob changes the advantages exactly as
    `otb_advantages` predicts, and the loss with them."""
    ScoredEnv.resets = 0
    trainer = _env_trainer(tmp_path, "default", base_model, tool_tokenizer)
    assert trainer.reward_func_names == ["ScoredEnv"]  # TRL's environment-owned reward, the only source
    trainer.model.train()
    batch = trainer._generate_and_score_completions(_rows(trainer))

    expected_rewards = torch.tensor([float(k % 3) for k in range(1, 9)])  # one reset per rollout, in order
    torch.testing.assert_close(batch["rewards"], expected_rewards, rtol=0, atol=0)
    mask = batch["completion_mask"] * batch["tool_mask"]  # (B, T) the loss mask
    holes = (mask[:, :-1] == 0) & (mask[:, 1:] == 1)
    assert holes.any(), "the tool mask must have holes for the positions knob to matter"
    energy = batch["old_per_token_energy"]  # (B, T) from the behaviour forward
    reference = _full_logits_energy(trainer.model, batch)
    valid = mask.bool()
    torch.testing.assert_close(energy[valid].double(), reference[valid], rtol=1e-5, atol=1e-5)

    # Defaults on a tool-use batch: valid positions and zero tail on (verl's tool-use estimator's defaults)
    zero_tail = trainer.args.otb_handle_zero_tail
    assert otb_zero_tail(zero_tail, trainer._estimator_inputs(batch, mask, None).tool_use) is True
    single_turn = {k: v for k, v in batch.items() if k != "tool_mask"}
    assert otb_zero_tail(zero_tail, trainer._estimator_inputs(single_turn, mask, None).tool_use) is False

    losses, advantages = {}, {}
    for zero_tail in (None, True, False):
        for positions in ("valid", "absolute"):
            name = f"zt{zero_tail}-{positions}"
            knob_trainer = (
                trainer
                if (zero_tail, positions) == (None, "valid")
                else _env_trainer(
                    tmp_path, name, base_model, tool_tokenizer, otb_handle_zero_tail=zero_tail,
                    otb_token_positions=positions,
                )
            )  # fmt: skip
            losses[zero_tail, positions], advantages[zero_tail, positions] = _loss_and_advantages(knob_trainer, batch)
            predicted = otb_advantages(
                batch["rewards"], energy, mask, groups_of(batch["group_ids"]),
                handle_zero_tail=True if zero_tail is None else zero_tail, token_positions=positions,
            )  # fmt: skip
            torch.testing.assert_close(advantages[zero_tail, positions], predicted, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(advantages[None, "valid"], advantages[True, "valid"], rtol=0, atol=0)
    for positions in ("valid", "absolute"):  # the zero-tail knob acts, on the advantages and on the loss
        assert not torch.allclose(advantages[True, positions], advantages[False, positions])
        assert not torch.isclose(losses[True, positions], losses[False, positions], rtol=1e-6, atol=0)
    for zero_tail in (True, False):  # the positions knob acts
        assert not torch.allclose(advantages[zero_tail, "valid"], advantages[zero_tail, "absolute"])
        assert not torch.isclose(losses[zero_tail, "valid"], losses[zero_tail, "absolute"], rtol=1e-6, atol=0)


def test_environment_and_reward_funcs_combine_with_trl_weights(tmp_path, tool_tokenizer, base_model):
    """A reward function (weight 2) beside the environment's reward (weight 1, TRL's): OTB's raw reward is their
    weighted sum, as TRL's logged `reward`."""

    def one(completions, **kwargs):
        return [1.0] * len(completions)

    ScoredEnv.resets = 0
    trainer = _env_trainer(tmp_path, "weights", base_model, tool_tokenizer, reward_funcs=[one], reward_weights=[2.0])
    assert trainer.reward_func_names == ["one", "ScoredEnv"]
    trainer.model.train()
    batch = trainer._generate_and_score_completions(_rows(trainer))
    expected = 2.0 + torch.tensor([float(k % 3) for k in range(1, 9)])
    torch.testing.assert_close(batch["rewards"], expected, rtol=0, atol=0)


def test_energy_record_does_not_depend_on_the_module_object(tmp_path, tool_tokenizer, base_model):
    """TRL passes whatever module wraps the model (DDP, FSDP, DeepSpeed, PEFT): a fresh wrapper module, never seen at
    construction and without hooks, still gets its energy recorded beside its log-probs, in batch chunks too."""

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    trainer = OTBTrainer(
        model=clone_model(base_model), reward_funcs=length_reward, args=_config(tmp_path, "wrapper"),
        train_dataset=tiny_dataset(8), processing_class=tool_tokenizer,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(10, len(tool_tokenizer), (5, 12), generator=gen)
    attention = torch.ones_like(input_ids)
    attention[1, -3:] = 0
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(Wrapper(trainer.model), input_ids, attention, 7,
                                                                 batch_size=2)  # fmt: skip
    energy = trainer._energy.take(logps, "test")
    batch = {"prompt_ids": input_ids[:, :5], "prompt_mask": attention[:, :5], "completion_ids": input_ids[:, 5:],
             "completion_mask": attention[:, 5:]}  # fmt: skip
    valid = attention[:, 5:].bool()
    torch.testing.assert_close(energy[valid].double(), _full_logits_energy(trainer.model, batch)[valid], rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    with pytest.raises(RuntimeError, match="no energy"):  # records are consumed: nothing stale is ever reused
        trainer._energy.take(logps, "test")


def test_off_policy_training_forward_runs_trl_head_without_the_energy(tmp_path, tool_tokenizer, base_model):
    """Off-policy the advantages use the behaviour forward's energy (`old_per_token_energy`), so the training forward
    runs TRL's own head, without `log_sum_sq_probs`: the same loss and gradients as with the energy computed there.
    The behaviour forward and the on-policy training forward (whose energy is used) still compute it."""
    trainer = OTBTrainer(
        model=clone_model(base_model), reward_funcs=length_reward, args=_config(tmp_path, "skip"),
        train_dataset=tiny_dataset(8), processing_class=tool_tokenizer,
    )  # fmt: skip
    with_energy = []  # one entry per fused-head forward: did it compute `log_sum_sq_probs`?
    trainer._energy.head.register_forward_hook(
        lambda module, args, out: (
            with_energy.append(out.log_sum_sq_probs is not None) if isinstance(out, FusedCausalLMOutput) else None
        )
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions(_rows(trainer))
    assert "old_per_token_energy" in batch and with_energy == [True, True]  # the behaviour forward, 2 chunks of 4

    with_energy.clear()
    loss, grads, metrics = compute_loss_and_grads(trainer, batch)
    assert with_energy == [False] and trainer._energy.training_energy is None
    trainer._energy.trl_forward = trainer._energy.fused_forward  # the energy computed in the training forward too
    loss_e, grads_e, metrics_e = compute_loss_and_grads(trainer, batch)
    assert with_energy == [False, True]
    torch.testing.assert_close(loss, loss_e, rtol=0, atol=0)
    assert grads.keys() == grads_e.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], grads_e[name], rtol=0, atol=0, msg=name)
    assert metrics == metrics_e and metrics["otb/energy_mean"][0] > 0

    with_energy.clear()  # on-policy (no behaviour forward): the training forward's energy is the one used
    on_policy = {k: v for k, v in batch.items() if k not in ("old_per_token_logps", "old_per_token_energy")}
    compute_loss_and_grads(trainer, on_policy)
    assert with_energy == [True] and trainer._energy.training_energy is not None


def test_lora_behaviour_energy_is_the_adapted_policy_not_the_reference(tmp_path, tool_tokenizer, base_model):
    """LoRA with beta > 0: TRL's reference forward runs through the same module with the adapter disabled, right after
    the behaviour forward. `old_per_token_energy` is the adapted policy's (checked against full logits), not the
    reference's."""
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = OTBTrainer(
        model=clone_model(base_model), reward_funcs=length_reward,
        args=_config(tmp_path, "lora", beta=0.1, max_completion_length=6), train_dataset=tiny_dataset(8),
        processing_class=tool_tokenizer, peft_config=peft_config,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a non-zero adapter: the adapted policy differs from the reference
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 0, 0, 1, 1, 1, 1)])
    valid = batch["completion_mask"].bool()
    adapted = _full_logits_energy(trainer.model, batch)
    with trainer.model.disable_adapter():
        reference = _full_logits_energy(trainer.model, batch)
    assert float((adapted - reference)[valid].abs().max()) > 1e-3
    torch.testing.assert_close(batch["old_per_token_energy"][valid].double(), adapted[valid], rtol=1e-5, atol=1e-5)
    loss, _ = _loss_and_advantages(trainer, batch)
    assert torch.isfinite(loss)


def all_none_reward(completions, **kwargs):
    return [None] * len(completions)


def test_otb_drops_unscorable_rows_from_the_baseline(tmp_path, tool_tokenizer, base_model):
    """OTBTrainer.compute_advantages on a batch whose raw rewards hold NaN: the scorable rows' advantages equal those
    of the same batch with the NaN rows removed (baseline, group size and zero-tail lengths all ignore them), and the
    NaN rows get 0. Counter-check: reading NaN as reward 0 would change them."""
    tokenizer, model = tool_tokenizer, base_model
    args = OTBConfig(**cpu_config_kwargs(tmp_path, per_device_train_batch_size=4, num_generations=4))
    trainer = OTBTrainer(clone_model(model), all_none_reward, args=args, train_dataset=tiny_dataset(4),
                         processing_class=tokenizer)  # fmt: skip
    trainer.model.train()
    g = torch.Generator().manual_seed(0)
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    lengths = torch.tensor([3, 7, 5, 2, 6, 4, 4, 1, 5, 5, 2, 3])  # row 1 (NaN) is its group's unique longest
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()  # (12, 7)
    energy = torch.rand(12, 7, generator=g) * mask  # (12, 7) e_t >= 0
    rewards = torch.tensor([0.3, float("nan"), 1.0, 0.0, 0.5, 0.2, float("nan"), float("nan"),
                            float("nan"), float("nan"), float("nan"), float("nan")])  # fmt: skip
    scored = ~torch.isnan(rewards)

    inputs = {"rewards": rewards, "old_per_token_energy": energy, "group_ids": group_ids}
    full = trainer.compute_advantages(inputs, torch.zeros(12, 7), mask)  # (12, 7) groups of num_generations = 4
    # the trainer's estimator on each group's scored rows alone (groups of 3, 2 and none)
    members = [torch.nonzero(scored & (group_ids == g)).flatten() for g in group_ids.unique()]
    kept = torch.cat(
        [
            trainer.estimator.estimate(
                EstimatorInputs(mask=mask[rows], rewards=rewards[rows], energy=energy[rows], group_size=len(rows)),
                **trainer._estimator_knobs,
            ).advantages
            for rows in members
            if len(rows)
        ]
    )  # (5, 7)
    torch.testing.assert_close(full[scored], kept, atol=0.0, rtol=0.0)
    assert torch.equal(full[~scored], torch.zeros(int((~scored).sum()), 7))
    assert (full[scored] != 0).any()

    inputs = {"rewards": torch.nan_to_num(rewards), "old_per_token_energy": energy, "group_ids": group_ids}
    as_zero = trainer.compute_advantages(inputs, torch.zeros(12, 7), mask)
    assert not torch.allclose(as_zero[scored], full[scored])


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(advantage_estimator="grpo"), "advantage_estimator must be 'otb'"),
        (dict(otb_token_positions="compact"), "otb_token_positions must be one of"),
        (dict(otb_handle_zero_tail="yes"), "otb_handle_zero_tail must be True, False or None"),
    ],
)
def test_config_values_are_validated_at_construction(tmp_path, bad, match):
    """Every value of OTB's own fails at `OTBConfig(...)`, naming the field and the fix, before any folder is written
    (TRL's settings are checked where `GRPOTrainer`'s are: tests/trainers/test_args_check.py)."""
    with pytest.raises(ValueError, match=match):
        OTBConfig(**cpu_config_kwargs(tmp_path / "out", **bad))
    assert not (tmp_path / "out").exists()
    args = OTBConfig(**cpu_config_kwargs(tmp_path / "out"))
    assert (args.otb_token_positions, args.otb_handle_zero_tail) == ("valid", None)


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_otb_rejects_trl_loss_types_itself(tmp_path, loss_type):
    """TRL's cispo/sapo/vespo compute their loss from TRL's group-mean advantages: every trainer whose estimator is
    OTB's rejects them, through the base's one check. That includes the base trainer given an OTBConfig, which
    hands these loss types to TRL's own loss otherwise, and the method trainers with `advantage_estimator="otb"`."""
    from trl_groupopt import CTPOConfig, CTPOTrainer, DFPOConfig, DFPOTrainer, ECHOConfig, ECHOTrainer
    from trl_groupopt.trainer.base import GroupOptTrainer

    kwargs = cpu_config_kwargs(tmp_path, loss_type=loss_type)
    cases = [
        (OTBTrainer, OTBConfig(**kwargs)),
        (GroupOptTrainer, OTBConfig(**kwargs)),
        (ECHOTrainer, ECHOConfig(**kwargs, advantage_estimator="otb", batch_ratio_scope="micro_batch")),
        (CTPOTrainer, CTPOConfig(**kwargs, advantage_estimator="otb")),
        (DFPOTrainer, DFPOConfig(**kwargs, advantage_estimator="otb", dfpo_transform="symmetric_clip")),
    ]
    for trainer_cls, args in cases:
        with pytest.raises(
            ValueError,
            match=rf"loss_type='{loss_type}' is not supported by {trainer_cls.__name__}: .*drop the advantages of "
            r"advantage_estimator='otb'",
        ):
            trainer_cls.validate_args(args)
