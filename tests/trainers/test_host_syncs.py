"""No objective stalls a GPU: host syncs per micro-batch, counted on CPU with `tests.sync_counter.SyncCounter`.

A host sync (a value read on the host: `.item()`, `bool(tensor)`, `unique`, `nonzero`, boolean indexing, a copy to
the CPU) makes the CPU wait for every queued CUDA kernel. The counter sees the ops a CUDA run would wait for on any
device, so this CPU test guards the GPU property (issue 37: DFPO made 27 per micro-batch, 21 of them `unique`).

- Every pure objective and estimator, called as the trainer calls it (the group layout from `num_generations`) on
  realistic tensors, loss and backward: zero syncs.
- Every registered method's trainer under its spec's `acting_settings` (and the DFPO transforms `orth_proj`,
  `orth_proj_qp`, OTB's advantages under CTPO and ECHO) on one off-policy micro-batch, `_compute_loss` and backward:
  zero syncs inside `objective` and `compute_advantages`, and no more syncs in all than TRL's `GRPOTrainer` on the
  same batch.
"""

from __future__ import annotations

import functools

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tests.distributed import batches
from tests.helpers import (
    clone_model,
    cpu_config_kwargs,
    length_reward,
    method_config,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from tests.selection import tested_methods
from tests.sync_counter import SyncCounter
from trl_groupopt import get_method
from trl_groupopt.core.common import Groups, clipped_surrogate_loss
from trl_groupopt.core.estimators import ESTIMATORS, EstimatorInputs
from trl_groupopt.methods.ctpo.objective import ctpo_loss
from trl_groupopt.methods.dfpo.diagnostics import dfpo_diagnostics
from trl_groupopt.methods.dfpo.grpo_fix import symmetric_clip_loss
from trl_groupopt.methods.dfpo.objective import TRANSFORMS, dfpo_loss
from trl_groupopt.methods.echo.objective import echo_batch_ratio_coupling, echo_log_ratio_totals, echo_loss

GROUP = batches.GROUP_SIZE
ROWS = batches.HALF  # one micro-batch: two whole groups
#: Configurations beside each registered method's defaults (name -> (method, overrides)).
VARIANTS = {
    "dfpo_orth_proj": ("dfpo", {"dfpo_transform": "orth_proj"}),
    "dfpo_orth_proj_qp": ("dfpo", {"dfpo_transform": "orth_proj_qp"}),
    "dfpo_orth_proj_unclipped": ("dfpo", {"dfpo_transform": "orth_proj", "dfpo_orthogonal_over": "unclipped"}),
    "ctpo+otb": ("ctpo", {"advantage_estimator": "otb"}),
    "echo+otb": ("echo", {"advantage_estimator": "otb"}),
}
#: Every registered method under its spec's `acting_settings` (its mechanism acts on the off-policy micro-batch), then
#: the variants of the methods tested (tests/selection.py).
CASES = {
    **{name: (name, dict(get_method(name).acting_settings)) for name in tested_methods()},
    **{name: case for name, case in VARIANTS.items() if case[0] in tested_methods()},
}
SETTINGS = dict(per_device_train_batch_size=ROWS, num_generations=GROUP, max_completion_length=batches.COMPLETION_LEN,
                steps_per_generation=2, gradient_accumulation_steps=1, beta=0.0)  # fmt: skip


def _micro_batch(tokenizer, model) -> dict:
    """Two whole groups in `_generate_and_score_completions`' layout, off-policy: behaviour log-probs from
    `batches.log_ratios("mixed")` (some tokens and sequences clipped), raw rewards, the behaviour policy's energy."""
    full = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    batch = {key: value[:ROWS] for key, value in full.items() if key != "num_items_in_batch"}
    mask = batch["completion_mask"]
    with torch.no_grad():
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        attention = torch.cat([batch["prompt_mask"], mask], 1)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, batches.PROMPT_LEN - 1 : -1]
        logps = logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    gen = torch.Generator().manual_seed(3)
    batch.update(
        rewards=batch.pop("rewards_per_func")[:, 0],
        group_ids=torch.arange(ROWS) // GROUP,
        old_per_token_logps=(logps - batches.log_ratios("mixed")[:ROWS]) * mask,
        old_per_token_energy=torch.rand(mask.shape, generator=gen) * mask,
        num_items_in_batch=2 * mask.sum(),  # the generation batch: 2 micro-batches
    )
    return batch


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=5)
    return tokenizer, model, _micro_batch(tokenizer, model), tmp_path_factory.mktemp("syncs")


def _trace(trainer, inputs: dict) -> SyncCounter:
    """Syncs of one micro-batch's `_compute_loss` and backward; `scoped` holds those inside the method's hooks."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    with SyncCounter() as syncs:
        for hook in ("objective", "compute_advantages"):
            if hasattr(trainer, hook):
                setattr(trainer, hook, syncs.scope(hook, getattr(trainer, hook)))
        trainer._compute_loss(trainer.model, dict(inputs)).backward()
    return syncs


@pytest.fixture(scope="module")
def trl_syncs(setup) -> SyncCounter:
    tokenizer, model, inputs, root = setup
    args = GRPOConfig(**cpu_config_kwargs(root / "trl", **SETTINGS))
    trainer = GRPOTrainer(clone_model(model), length_reward, args=args, train_dataset=tiny_dataset(16),
                          processing_class=tokenizer)  # fmt: skip
    syncs = _trace(trainer, inputs)
    print(f"\nTRL GRPOTrainer: {syncs.total} host syncs per micro-batch {dict(syncs.counts)}")
    assert syncs.total > 0  # the counter sees TRL's own metric reads: it is not blind
    return syncs


@pytest.mark.parametrize("case", list(CASES))
def test_method_syncs_no_more_than_trl(setup, trl_syncs, case):
    tokenizer, model, inputs, root = setup
    method, overrides = CASES[case]
    args = method_config(method, root / case, **SETTINGS, **overrides)
    trainer = get_method(method).trainer_class(clone_model(model), length_reward, args=args,
                                               train_dataset=tiny_dataset(16), processing_class=tokenizer)  # fmt: skip
    syncs = _trace(trainer, inputs)
    print(f"\n{case}: {syncs.total} host syncs per micro-batch (TRL GRPOTrainer {trl_syncs.total}) "
          f"{dict(syncs.counts)}; inside the method's hooks: {syncs.scoped}")  # fmt: skip
    sites = {site: n for (_, site), n in syncs.sites.items()}
    assert not syncs.scoped, f"{case}: syncs inside objective/compute_advantages: {syncs.scoped}, at {sites}"
    assert syncs.total <= trl_syncs.total, f"{case}: {dict(syncs.counts)} at {sites} vs TRL's {dict(trl_syncs.counts)}"


def _trace_echo_step(trainer, buffered: list[dict], step: int) -> SyncCounter:
    """Syncs of one optimizer step of two micro-batches served from TRL's buffer (`_step` 2 * step, 2 * step + 1),
    `_compute_loss` and backward each; `scoped` holds those inside `objective` and `compute_advantages`."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    trainer._buffered_inputs, trainer._step_totals, trainer.state.global_step = buffered, None, step
    hooks = {hook: getattr(trainer, hook) for hook in ("objective", "compute_advantages")}
    try:
        with SyncCounter() as syncs:
            for hook, method in hooks.items():
                setattr(trainer, hook, syncs.scope(hook, method))
            for micro_step in (0, 1):
                trainer._step = 2 * step + micro_step
                trainer._compute_loss(trainer.model, buffered[micro_step]).backward()
    finally:
        for hook in hooks:
            delattr(trainer, hook)
        trainer._buffered_inputs, trainer._step = None, 0
    return syncs


@pytest.mark.skipif("echo" not in tested_methods(), reason="ECHO is not among the tested methods")
def test_echo_step_scope_syncs_over_a_rollout(setup, trl_syncs):
    """ECHO's default "step" scope over 2 micro-batches per optimizer step, 2 steps per rollout: on the rollout's
    first step (no extra forward: docs/echo.md) the syncs of the base trainer, on its second the extra no-grad
    forward's too; never more per micro-batch than TRL's, none inside the method's hooks."""
    tokenizer, model, inputs, root = setup
    schedule = dict(SETTINGS, gradient_accumulation_steps=2, num_iterations=2)
    args = method_config("echo", root / "echo_step", **schedule)
    trainer = get_method("echo").trainer_class(clone_model(model), length_reward, args=args,
                                               train_dataset=tiny_dataset(16), processing_class=tokenizer)  # fmt: skip
    assert args.batch_ratio_scope == "step"
    buffered = [dict(inputs), dict(inputs)]  # two micro-batches (distinct objects, as TRL's split makes them)
    base = get_method("grpo").trainer_class(clone_model(model), length_reward,
                                            args=method_config("grpo", root / "grpo_two", **schedule),
                                            train_dataset=tiny_dataset(16), processing_class=tokenizer)  # fmt: skip
    base_syncs = _trace(base, inputs).total
    with torch.no_grad(), SyncCounter() as forward:  # the extra forward alone (its count depends on TRL's kernel)
        get_method("grpo").trainer_class.loss_inputs(trainer, trainer.model, dict(inputs))
    assert forward.total > 0
    for step, extra in ((0, 0), (1, forward.total)):  # (optimizer step of the rollout, extra syncs per micro-batch)
        syncs = _trace_echo_step(trainer, buffered, step)
        print(f"\necho step scope, optimizer step {step + 1} of the rollout: {syncs.total / 2:g} host syncs per "
              f"micro-batch {dict(syncs.counts)} (TRL GRPOTrainer {trl_syncs.total}, base {base_syncs})")  # fmt: skip
        assert not syncs.scoped, syncs.scoped
        assert syncs.total / 2 <= trl_syncs.total
        assert syncs.total == 2 * (base_syncs + extra)


def _token_inputs(dtype=torch.float32, seed: int = 0):
    """(logp leaf, old, advantages (B,), mask) of realistic shapes: ragged rows, one empty row, off-policy ratios."""
    gen = torch.Generator().manual_seed(seed)
    batch, length = 4 * GROUP, 32
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).float()
    old = -torch.rand(batch, length, generator=gen, dtype=dtype) * 3
    logp = (old + 0.2 * torch.randn(batch, length, generator=gen, dtype=dtype)).requires_grad_(True)
    rewards = torch.randint(0, 2, (batch,), generator=gen).to(dtype)
    grouped = rewards.view(-1, GROUP)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    return logp, old, adv, mask, rewards


def _pure_calls():
    """name -> (objective taking (logp, old, adv, mask, rewards), needs backward)."""
    groups = functools.partial(Groups.contiguous, size=GROUP)
    calls = {
        "clipped_surrogate_loss": lambda lp, o, a, m, r: clipped_surrogate_loss(lp, o, a, m, epsilon_low=0.2,
                                                                                epsilon_high=0.28),
        "clipped_surrogate_loss/sequence": lambda lp, o, a, m, r: clipped_surrogate_loss(
            lp, o, a, m, epsilon_low=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence"),
        "symmetric_clip_loss": lambda lp, o, a, m, r: symmetric_clip_loss(lp, o, a, m, epsilon_high=0.2,
                                                                          importance_weights=m[:, :1] * 0.5),
        "ctpo_loss/cumprod": lambda lp, o, a, m, r: ctpo_loss(lp, o, a, m, epsilon_low=0.025, epsilon_high=0.05,
                                                              dual_clip=0.05, position_power=0.5),
        "ctpo_loss/geomean": lambda lp, o, a, m, r: ctpo_loss(lp, o, a, m, epsilon_low=0.025, epsilon_high=0.05,
                                                              dual_clip=0.05, position_power=-0.5,
                                                              ratio_mode="geomean"),
        "echo_loss/micro_batch": lambda lp, o, a, m, r: echo_loss(lp, o, a, m, epsilon_low=0.2, epsilon_high=0.2,
                                                                  batch_epsilon_low=0.2, batch_epsilon_high=0.2),
    }  # fmt: skip

    def echo_step(lp, o, a, m, r):  # the "step" scope: totals and coupling over two parts, then the loss
        kwargs = dict(epsilon_low=0.2, epsilon_high=0.2, batch_epsilon_low=0.05, batch_epsilon_high=0.05)
        totals = echo_log_ratio_totals(lp, o, m) * 2
        coupling = 2 * echo_batch_ratio_coupling(lp, o, a, m, **kwargs, log_ratio_sum=totals[0],
                                                 token_count=totals[1])  # fmt: skip
        return echo_loss(lp, o, a, m, **kwargs, log_ratio_sum=totals[0], token_count=totals[1], coupling_sum=coupling,
                         importance_weights=m * 0.9)  # fmt: skip

    calls["echo_loss/step"] = echo_step

    def dfpo(lp, o, a, m, r, transform, over):  # the loss and the diagnostics its trainer logs
        out = dfpo_loss(lp, o, a, m, groups(lp.shape[0]), transform=transform, epsilon_low=3e-4,
                        epsilon_high=4e-4, orthogonal_over=over, importance_weights=m[:, :1])  # fmt: skip
        out.metrics.update(dfpo_diagnostics(out.weights, "dapo"))
        return out

    for transform in TRANSFORMS:
        for over in ("all", "unclipped") if transform in ("orth_proj", "orth_proj_qp") else ("all",):
            calls[f"dfpo_loss/{transform}/{over}"] = functools.partial(dfpo, transform=transform, over=over)
    for name, estimator in ESTIMATORS.items():
        knobs = {"otb_token_positions": "valid", "otb_handle_zero_tail": None} if estimator.knobs else {}
        for tool_use in (False, True):
            calls[f"estimator/{name}/tool_use={tool_use}"] = functools.partial(
                lambda lp, o, a, m, r, estimator, knobs, tool_use: estimator.estimate(EstimatorInputs(
                    mask=m, trl_advantages=a, rewards=r, group_size=GROUP, energy=torch.rand_like(o) * m,
                    tool_use=tool_use), **knobs),
                estimator=estimator, knobs=knobs, tool_use=tool_use)  # fmt: skip
    return calls


@pytest.mark.parametrize("name", list(_pure_calls()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_objectives_and_estimators_never_sync(name, dtype):
    """Each pure objective's loss and backward, and each estimator, as the trainer calls them: zero host syncs."""
    logp, old, adv, mask, rewards = _token_inputs(dtype)
    call = _pure_calls()[name]
    with SyncCounter() as syncs:
        out = call(logp, old, adv, mask, rewards)
        if hasattr(out, "per_token_loss"):
            (out.per_token_loss * mask).sum().backward()
    assert syncs.total == 0, f"{name}: {dict(syncs.counts)} at {dict(syncs.sites)}"
    if hasattr(out, "per_token_loss"):
        assert logp.grad is not None and torch.isfinite(logp.grad).all()
    else:
        assert torch.isfinite(out.advantages).all()
