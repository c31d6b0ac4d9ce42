"""ECHO's batch-ratio scopes in the trainer: "step" forms R over the whole optimizer step (the paper's mini-batch).

`_compute_loss` is driven directly on the fixed group batch of `tests.distributed.batches` (16 rows; the two halves
are the two gradient-accumulation micro-batches, buffered as TRL's `_prepare_inputs` buffers them), with fixed
off-policy log-ratios `old = logp_initial - log_ratio`. In float64: TRL's fused LM head returns float32 log-probs, so
the trainer's forward is replaced by a plain float64 log-softmax of the (float64) model's logits. Reference: `echo_loss` over the union of the two
micro-batches (R over every token of the step), aggregated as dapo does (`sum(loss * mask) / num_items_in_batch`),
differentiated once. "step" must give that gradient (accumulated over the micro-batches) to 1e-10 in every scenario;
"micro_batch" must not (so the comparison can fail). The same with TRL's per-token loss multipliers (vLLM IS weights in
every mode, the entropy mask, the off-policy mask, all three): the reference then weighs each token's loss by the
multipliers TRL computes for its micro-batch at the step's parameters, with R still over every token of the step.
"""

from __future__ import annotations

from types import MethodType

import pytest
import torch
from trl import GRPOTrainer

from tests.distributed import batches
from tests.helpers import cpu_config_kwargs, float64_forward, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from trl_groupopt import ECHOConfig, ECHOTrainer
from trl_groupopt.methods.echo.objective import echo_log_ratio_totals, echo_loss

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


def _whole_step_reference(trainer, inputs, weights=None):
    """The objective formed over the whole step: R over all 16 rows, dapo aggregation, one backward; `weights`
    (a function of the step's log-probs and entropies) gives the per-token loss multipliers."""
    trainer.model.zero_grad(set_to_none=True)
    logps, entropies = trainer._forward_logps_and_entropies(trainer.model, inputs)[:2]
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
        importance_weights=None if weights is None else weights(logps.detach(), entropies.detach()),
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


# ---------------------------------------------------------------- with TRL's per-token loss multipliers
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
IS_CLIP_MAX = 3.0  # TRL's default vllm_importance_sampling_clip_max (clip_min: None)
OFF_POLICY_THRESHOLD = 0.02  # masks some negative-advantage rows of both scenarios below, not all
ENTROPY_QUANTILE = 0.5
MULTIPLIERS = {  # name -> (config overrides, vLLM IS mode or None)
    **{f"vllm_is_{mode}": ({}, mode) for mode in VLLM_IS_MODES},
    "entropy_mask": ({"top_entropy_quantile": ENTROPY_QUANTILE}, None),
    "off_policy_mask": ({"off_policy_mask_threshold": OFF_POLICY_THRESHOLD}, None),
    "all_three": (
        {"top_entropy_quantile": ENTROPY_QUANTILE, "off_policy_mask_threshold": OFF_POLICY_THRESHOLD},
        "token_mask",
    ),
}


def _vllm_is_ratio(old, sampling, mask, mode: str):
    """TRL 1.16's `importance_sampling_ratio` (`GRPOTrainer._generate_and_score_completions`) for one mode."""
    diff = (old - sampling) * mask  # (B, T)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)  # (B, 1)
    ratio = diff.exp()
    if mode.endswith("truncate"):
        return ratio.clamp(max=IS_CLIP_MAX)
    return ratio.masked_fill(ratio > IS_CLIP_MAX, 0.0)


@pytest.fixture(scope="module")
def weighted(tmp_path_factory):
    """{name: "step" trainer with that multiplier on}, same model and tokenizer as `setup`'s."""
    tokenizer = tiny_tokenizer()
    trainers = {}
    for name, (overrides, mode) in MULTIPLIERS.items():
        trainer = _trainer(tmp_path_factory.mktemp(name), tokenizer, "step", **overrides)
        assert trainer.args.batch_ratio_scope == "step"
        if mode is not None:  # as TRL sets them with use_vllm=True (no vLLM engine needed for `_compute_loss`)
            trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
            trainer.vllm_importance_sampling_mode = mode
        trainers[name] = trainer
    return tokenizer, trainers


def _weighted_inputs(trainer, tokenizer, scenario: str) -> dict:
    """`_union_inputs` plus, with vLLM IS on, vLLM's sampling log-probs (0.6 off the behaviour policy per token) and
    TRL's IS ratio from them (some ratios above the clip: truncated or masked, by mode)."""
    inputs = _union_inputs(trainer, tokenizer, scenario)
    if trainer.use_vllm:
        gen = torch.Generator().manual_seed(5)
        mask = inputs["completion_mask"].double()
        noise = 0.6 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)
        sampling = inputs["old_per_token_logps"] + noise * mask
        inputs["sampling_per_token_logps"] = sampling
        mode = trainer.vllm_importance_sampling_mode
        ratio = _vllm_is_ratio(inputs["old_per_token_logps"], sampling, mask, mode)
        rows = ratio.expand(mask.shape)[mask.bool()]  # the valid tokens' ratios
        assert bool((rows == (0.0 if mode.endswith("mask") else IS_CLIP_MAX)).any()) and bool((rows < 1).any())
        inputs["importance_sampling_ratio"] = ratio
    return inputs


def _reference_weights(trainer, inputs):
    """The multipliers TRL applies (`GRPOTrainer._compute_loss`), from TRL's own functions, per micro-batch."""
    mask = inputs["completion_mask"]
    halves = (slice(0, batches.HALF), slice(batches.HALF, batches.NUM_ROWS))

    def weights(logps, entropies):
        product = torch.ones(mask.shape, dtype=torch.float64)
        if trainer.off_policy_mask_threshold is not None:  # per row: the union's mask is its halves' masks
            product = product * GRPOTrainer.get_off_policy_mask(
                inputs["advantages"].unsqueeze(1),
                logps,
                inputs.get("sampling_per_token_logps", inputs["old_per_token_logps"]),
                mask,
                trainer.off_policy_mask_threshold,
            )
        if trainer.top_entropy_quantile < 1:  # TRL's quantile is over one micro-batch (on all processes)
            threshold = 1 - trainer.top_entropy_quantile
            product = product * torch.cat(
                [trainer.get_high_entropy_mask(entropies[h], mask[h], threshold) for h in halves]
            )
        if trainer.use_vllm:
            product = product * inputs["importance_sampling_ratio"]
        return product

    return weights


@pytest.mark.parametrize("scenario", ["unclipped", "mixed"])
@pytest.mark.parametrize("name", list(MULTIPLIERS))
def test_step_scope_is_exact_with_loss_multipliers(weighted, name, scenario):
    """The accumulated gradient equals the whole-step objective's with TRL's multipliers on every token's loss, to
    1e-10 in float64; the multipliers act (they change the gradient) and R stays the step's, unclipped here, so the
    coupling of Eq. 34 spans both micro-batches and must count the multipliers."""
    tokenizer, trainers = weighted
    trainer = trainers[name]
    inputs = _weighted_inputs(trainer, tokenizer, scenario)
    weights = _reference_weights(trainer, inputs)
    ref_loss, ref_grads, ref_metrics = _whole_step_reference(trainer, inputs, weights)
    plain_loss, plain_grads, _ = _whole_step_reference(trainer, inputs)
    loss, grads, metrics = _accumulated_step(trainer, inputs)

    assert ref_metrics["echo/batch_clipped"].item() == 0.0
    with torch.no_grad():
        logps, entropies, _ = trainer._forward_logps_and_entropies(trainer.model, inputs)
    applied = weights(logps, entropies).expand(inputs["completion_mask"].shape)[inputs["completion_mask"].bool()]
    assert bool((applied == 0).any() or (applied != 1).any()) and bool((applied != 0).any())  # not all 1, not all 0
    assert _max_diff(ref_grads, plain_grads) > 1e-4  # the multipliers matter on this batch
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    assert _max_diff(grads, ref_grads) < ATOL
    step_ratio = ref_metrics["echo/batch_ratio"].item()
    assert metrics["echo/batch_ratio"] == pytest.approx([step_ratio, step_ratio], abs=1e-6)
