"""ECHO's batch-ratio scopes in the trainer: "step" forms R over the whole optimizer step (the paper's mini-batch).

`_compute_loss` is driven directly on the fixed group batch of `tests.distributed.batches` (16 rows; the two halves
are the two gradient-accumulation micro-batches, buffered as TRL's `_prepare_inputs` buffers them), with fixed
off-policy log-ratios `old = logp_initial - log_ratio`. In float64: TRL's fused LM head returns float32 log-probs, so
the trainer's forward is replaced by a plain float64 log-softmax of the (float64) model's logits. Reference: `echo_loss` over the union of the two
micro-batches (R over every token of the step), aggregated as dapo does (`sum(loss * mask) / num_items_in_batch`),
differentiated once. "step" must give that gradient (accumulated over the micro-batches) to 1e-10 in every scenario;
"micro_batch" must not (so the comparison can fail).
"""

from __future__ import annotations

from types import MethodType

import pytest
import torch

from tests.distributed import batches
from tests.helpers import cpu_config_kwargs, float64_forward, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from trl_groupopt import ECHOConfig, ECHOTrainer
from trl_groupopt.objectives.echo import echo_log_ratio_totals, echo_loss

ATOL = 1e-10
EPS = dict(epsilon=0.2, epsilon_high=0.28)  # batch_epsilon defaults to epsilon: R clipped outside [0.8, 1.2]


def _trainer(tmp_path, tokenizer, scope: str, **overrides):
    args = ECHOConfig(
        **cpu_config_kwargs(
            tmp_path / scope,
            per_device_train_batch_size=batches.HALF,
            num_generations=batches.GROUP_SIZE,
            max_completion_length=batches.COMPLETION_LEN,
            gradient_accumulation_steps=2,
            steps_per_generation=2,
            batch_ratio_scope=scope,
            **EPS,
            **overrides,
        )
    )
    trainer = ECHOTrainer(
        tiny_model(tokenizer, seed=2).double(),
        length_reward,
        args=args,
        train_dataset=tiny_dataset(8),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    trainer._forward_logps_and_entropies = MethodType(float64_forward, trainer)
    return trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    root = tmp_path_factory.mktemp("echo_step")
    return tokenizer, {scope: _trainer(root, tokenizer, scope) for scope in ("step", "micro_batch")}


def _union_inputs(trainer, tokenizer, scenario: str) -> dict:
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logps, _, _ = trainer._forward_logps_and_entropies(trainer.model, batch)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
    inputs = {key: batch[key] for key in keys}
    inputs["advantages"] = inputs["advantages"].double()
    inputs["old_per_token_logps"] = (logps - batches.log_ratios(scenario).double()).detach()
    return inputs


def _half(inputs: dict, part: int) -> dict:
    rows = slice(part * batches.HALF, (part + 1) * batches.HALF)
    return {k: (v if k == "num_items_in_batch" else v[rows]) for k, v in inputs.items()}


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _accumulated_step(trainer, inputs, global_step: int = 0):
    """One optimizer step of two micro-batches through TRL's buffer: (summed loss, accumulated grads, metrics)."""
    trainer.model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    trainer.state.global_step = global_step
    trainer._step_totals = None  # a fresh trainer state: other tests reuse (global_step, micro-step) pairs
    trainer._buffered_inputs = [_half(inputs, 0), _half(inputs, 1)]
    total = 0.0
    for micro_step in (0, 1):
        trainer._step = 2 * global_step + micro_step
        loss = trainer._compute_loss(trainer.model, trainer._buffered_inputs[micro_step])
        loss.backward()
        total = total + loss.detach()
    trainer._buffered_inputs, trainer._step = None, 0
    return total, _grads(trainer.model), dict(trainer._metrics["train"])


def _whole_step_reference(trainer, inputs):
    """The objective formed over the whole step: R over all 16 rows, dapo aggregation, one backward."""
    trainer.model.zero_grad(set_to_none=True)
    logps, _, _ = trainer._forward_logps_and_entropies(trainer.model, inputs)
    mask = inputs["completion_mask"].double()
    out = echo_loss(
        logps,
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask,
        epsilon_low=0.2,
        epsilon_high=0.28,
        batch_epsilon_low=0.2,
        batch_epsilon_high=0.2,
    )
    loss = (out.per_token_loss * mask).sum() / inputs["num_items_in_batch"]
    loss.backward()
    return loss.detach(), _grads(trainer.model), out.metrics


def _max_diff(grads_a: dict, grads_b: dict) -> float:
    assert grads_a.keys() == grads_b.keys() and grads_a
    return max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a)


@pytest.mark.parametrize("scenario", ["split", "unclipped", "shifted", "mixed"])
def test_step_scope_gradient_is_the_whole_step_objective(setup, scenario):
    """split: each half's R is clipped, the step's is not; unclipped: no R clipped, the coupling of Eq. 34 spans
    both micro-batches; shifted: the step's R is clipped (no coupling); mixed: rows with different shifts."""
    tokenizer, trainers = setup
    trainer = trainers["step"]
    inputs = _union_inputs(trainer, tokenizer, scenario)
    ref_loss, ref_grads, ref_metrics = _whole_step_reference(trainer, inputs)
    loss, grads, metrics = _accumulated_step(trainer, inputs)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    assert max(g.abs().max().item() for g in ref_grads.values()) > 1e-2  # a real gradient
    assert _max_diff(grads, ref_grads) < ATOL
    # both micro-batches use the step's R
    step_ratio = ref_metrics["echo/batch_ratio"].item()
    assert metrics["echo/batch_ratio"] == pytest.approx([step_ratio, step_ratio], abs=1e-6)

    micro_loss, micro_grads, micro_metrics = _accumulated_step(trainers["micro_batch"], inputs)
    if scenario in ("split", "unclipped", "mixed"):  # R per micro-batch: different clip or coupling
        assert _max_diff(micro_grads, ref_grads) > 1e-4
    if scenario == "split":
        assert ref_metrics["echo/batch_clipped"].item() == 0.0
        assert micro_metrics["echo/batch_clipped"] == [1.0, 1.0]
        assert abs(micro_loss.item() - ref_loss.item()) > 1e-3


def test_step_totals_are_computed_once_per_optimizer_step(setup, monkeypatch):
    """The extra no-grad forward runs at the first micro-batch of each step, over the step's micro-batches only."""
    tokenizer, trainers = setup
    trainer = trainers["step"]
    inputs = _union_inputs(trainer, tokenizer, "split")
    calls = []
    original = ECHOTrainer._compute_step_totals

    def counting(self, model, micro_batches):
        calls.append(len(micro_batches))
        return original(self, model, micro_batches)

    monkeypatch.setattr(ECHOTrainer, "_compute_step_totals", counting)
    _accumulated_step(trainer, inputs, global_step=0)
    _accumulated_step(trainer, inputs, global_step=1)
    assert calls == [2, 2]


def test_step_scope_needs_trls_buffer(setup):
    """Inputs that are not the buffered micro-batch of this micro-step: a clear error, not a silent wrong R."""
    tokenizer, trainers = setup
    trainer = trainers["step"]
    inputs = _union_inputs(trainer, tokenizer, "split")
    trainer._buffered_inputs = [_half(inputs, 0), _half(inputs, 1)]
    trainer._step_totals = None
    try:
        with pytest.raises(RuntimeError, match="not the buffered batch of this micro-step"):
            trainer._compute_loss(trainer.model, _half(inputs, 0))
    finally:
        trainer._buffered_inputs = None


@pytest.mark.parametrize("scope", ["step", "global"])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_wide_scopes_are_finite_with_non_finite_padding_log_probs(setup, tmp_path, scope, bad):
    """Non-finite old log-probs at masked positions change nothing (the totals mask with the objective's where)."""
    tokenizer, trainers = setup
    trainer = trainers["step"] if scope == "step" else _trainer(tmp_path, tokenizer, "global")
    inputs = _union_inputs(trainer, tokenizer, "unclipped")
    clean_loss, clean_grads, _ = _accumulated_step(trainer, inputs)
    padding = inputs["completion_mask"] == 0
    assert padding.any()
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"].masked_fill(padding, bad)
    loss, grads, _ = _accumulated_step(trainer, inputs)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, clean_loss, atol=ATOL, rtol=0)
    assert _max_diff(grads, clean_grads) < ATOL


def test_log_ratio_totals_mask_like_the_loss():
    logp = torch.tensor([[-1.0, float("-inf")], [-0.5, float("nan")]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -2.0], [float("inf"), -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0], [0, 0]])
    totals = echo_log_ratio_totals(logp, old, mask)
    torch.testing.assert_close(totals, torch.tensor([0.5, 1.0], dtype=torch.float64))
