"""Unscorable completions (a reward function returning None, or float('nan')) must not poison any objective.

What TRL 1.16 does (`GRPOTrainer._calculate_rewards` / `_generate_and_score_completions`): a synchronous reward
function's `None` is replaced by `torch.nan` before the list becomes a tensor, so a `float('nan')` returned by the
reward function lands in exactly the same tensor as `None`: TRL cannot tell them apart and treats both as "this reward
function did not score this completion". A row where every reward function gave None/NaN is unscorable: it is left out
of its group's mean/std and its advantage is set to 0 (`nan_to_num`). `test_nan_reward_is_none_reward` checks that a
NaN-returning reward trains bit-identically to the None-returning one, for every trainer.

Our side (every registered method is run): the base trainer, ECHO, DFPO (min_replace, GRPO-fix) and CTPO consume TRL's
advantages (0 on unscorable rows); OTB consumes the raw rewards (NaN on unscorable rows,
`GroupOptTrainer._local_raw_rewards`) and drops those rows from the group before the baseline is formed
(`otb_advantages`), which `tests/trainers/test_otb_trainer.py::test_otb_drops_unscorable_rows_from_the_baseline`
checks against the same batch with those rows removed.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import set_seed

from tests.helpers import (
    assert_registered,
    clone_model,
    method_trainer,
    tiny_model,
    tiny_tokenizer,
)
from tests.selection import tested_methods
from trl_groupopt import OTBTrainer

NUM_GENERATIONS = 2
GENERATION_ROWS = 16  # per_device_train_batch_size 4 x steps_per_generation 4


def _unscorable(index: int) -> bool:
    """Rows left unscored: the whole first group of the generation batch, and every 3rd completion."""
    return index // NUM_GENERATIONS == 0 or index % 3 == 2


def _reward_with(missing):
    def partial_length_reward(completions, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [missing if _unscorable(i) else len(t) / 10.0 for i, t in enumerate(texts)]

    partial_length_reward.__name__ = "partial_length_reward"  # same metric names for both variants
    return partial_length_reward


none_reward = _reward_with(None)
nan_reward = _reward_with(float("nan"))


def all_none_reward(completions, **kwargs):
    return [None] * len(completions)


#: registry name -> config overrides (DFPO's min_replace: clip bounds its off-policy ratios reach); every other
#: registered method runs with its defaults.
OVERRIDES = {"dfpo": {"epsilon": 0.05, "epsilon_high": 0.05}}


def test_overrides_name_registered_methods():
    assert_registered(OVERRIDES, "OVERRIDES")


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=11)


def _train(method, output_dir, tiny, reward, max_steps=2):
    """Off-policy 2-step run (steps_per_generation 4 > accumulation 2) recording every micro-step's loss, every
    generation batch and (OTB) every advantage tensor."""
    tokenizer, model = tiny
    trainer = method_trainer(
        method, output_dir, clone_model(model), tokenizer, reward, num_examples=16, per_device_train_batch_size=4,
        num_generations=NUM_GENERATIONS, steps_per_generation=4, gradient_accumulation_steps=2, max_steps=max_steps,
        logging_nan_inf_filter=False, disable_tqdm=True, **OVERRIDES.get(method, {}))  # fmt: skip
    record = {"losses": [], "batches": [], "otb": []}
    compute_loss, generate = trainer._compute_loss, trainer._generate_and_score_completions

    def recording_compute_loss(model, inputs):
        loss = compute_loss(model, inputs)
        record["losses"].append(loss.detach().clone())
        return loss

    def recording_generate(inputs):
        output = generate(inputs)
        record["batches"].append({k: v.clone() for k, v in output.items() if isinstance(v, torch.Tensor)})
        return output

    trainer._compute_loss, trainer._generate_and_score_completions = recording_compute_loss, recording_generate
    if isinstance(trainer, OTBTrainer):
        advantages_of = trainer.compute_advantages

        def recording_advantages(inputs, per_token_logps, mask):
            advantages = advantages_of(inputs, per_token_logps, mask)
            record["otb"].append((inputs["rewards"].clone(), advantages.clone()))
            return advantages

        trainer.compute_advantages = recording_advantages
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    set_seed(0)
    trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return trainer, record, before, after


@pytest.mark.parametrize("method", tested_methods())
def test_unscorable_completions_train_cleanly(tmp_path, tiny, method):
    """None for a whole group and for every 3rd completion: losses, logs and parameters finite, parameters move,
    unscorable rows carry zero advantage (TRL) and, for OTB, zero token advantages from a NaN raw reward."""
    trainer, record, before, after = _train(method, tmp_path, tiny, none_reward)
    assert len(record["losses"]) == 4 and all(torch.isfinite(loss) for loss in record["losses"]), record["losses"]
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 2 and all(math.isfinite(e["loss"]) and math.isfinite(e["grad_norm"]) for e in logged)
    assert math.isfinite(logged[0]["reward"])  # TRL's logged reward skips the NaN rows

    (batch,) = record["batches"]
    unscorable = torch.tensor([_unscorable(i) for i in range(GENERATION_ROWS)])
    assert batch["advantages"].shape == (GENERATION_ROWS,)
    assert torch.equal(batch["advantages"][unscorable], torch.zeros(int(unscorable.sum())))
    assert (batch["advantages"][~unscorable] != 0).any()
    if isinstance(trainer, OTBTrainer):
        assert torch.equal(torch.isnan(batch["rewards"]), unscorable)  # raw rewards: NaN exactly where unscored
        assert len(record["otb"]) == 4
        for rewards, advantages in record["otb"]:  # each micro-batch (whole groups, shuffled)
            nan_rows = torch.isnan(rewards)
            assert torch.isfinite(advantages).all()
            assert torch.equal(advantages[nan_rows], torch.zeros_like(advantages[nan_rows]))
        assert sum(int(torch.isnan(r).sum()) for r, _ in record["otb"]) == int(unscorable.sum())


@pytest.mark.parametrize("method", tested_methods())
def test_nan_reward_is_none_reward(tmp_path, tiny, method):
    """TRL turns None into NaN before building the reward tensor, so float('nan') from a reward function is an
    unscorable completion too: the run is bit-identical to the None run (not a NaN loss, not an error)."""
    _, none_record, _, none_after = _train(method, tmp_path / "none", tiny, none_reward, max_steps=1)
    _, nan_record, _, nan_after = _train(method, tmp_path / "nan", tiny, nan_reward, max_steps=1)
    assert torch.equal(torch.stack(nan_record["losses"]), torch.stack(none_record["losses"]))
    assert all(torch.isfinite(loss) for loss in nan_record["losses"])
    for n, value in none_after.items():
        assert torch.equal(nan_after[n], value), n


@pytest.mark.parametrize("method", tested_methods())
def test_all_unscorable_batch_is_a_no_op(tmp_path, tiny, method):
    """Every completion unscorable: every advantage is 0, the loss is exactly 0 (beta=0) and AdamW leaves the
    parameters untouched; nothing becomes NaN."""
    _, record, before, after = _train(method, tmp_path, tiny, all_none_reward, max_steps=1)
    assert all(loss.item() == 0.0 for loss in record["losses"]), record["losses"]
    assert torch.equal(record["batches"][0]["advantages"], torch.zeros(GENERATION_ROWS))
    for n, value in before.items():
        assert torch.equal(after[n], value), n
