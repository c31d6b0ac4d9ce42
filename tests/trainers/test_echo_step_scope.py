"""ECHO's batch-ratio scopes in the trainer: "step" forms R over the whole optimizer step (the paper's mini-batch).

`_compute_loss` is driven directly on the fixed group batch of `tests.distributed.batches` (16 rows; the two halves
are the two gradient-accumulation micro-batches, buffered as TRL's `_prepare_inputs` buffers them). The trainers make
two passes over the buffered generation batch (`num_iterations=2`): micro-steps 0-1 are the rollout's first optimizer
step, where the policy is the one that scored the rollout, 2-3 its second, where it has moved. The off-policy
scenarios stand for the second: fixed log-ratios `old = logp_initial - log_ratio`; the first step's tests set
`old` to the current log-probs (one forward over all 16 rows, as TRL scores the generation batch). In float64: TRL's
fused LM head returns float32 log-probs, so the trainer's forward is replaced by a plain float64 log-softmax of the
(float64) model's logits. Reference: `echo_loss` over the union of the two micro-batches (R over every token of the
step), aggregated as dapo does (`sum(loss * mask) / num_items_in_batch`), differentiated once. "step" must give that
gradient (accumulated over the micro-batches) to 1e-10 in every scenario; "micro_batch" must not (so the comparison
can fail). The same with TRL's per-token loss multipliers (vLLM IS weights in every mode, the entropy mask, the
off-policy mask, all three): the reference then weighs each token's loss by the multipliers TRL computes for its
micro-batch at the step's parameters, with R still over every token of the step. On the first step the extra
no-grad forward is skipped where the buffer gives the totals (docs/echo.md): the loss and gradients equal those with
the forward, to 1e-10, and the loss forwards are counted (one per micro-batch there, two on the second step).
"""

from __future__ import annotations

from contextlib import contextmanager
from types import MethodType
from typing import NamedTuple
from unittest import mock

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
    settings = dict(
        per_device_train_batch_size=batches.HALF,
        num_generations=batches.GROUP_SIZE,
        max_completion_length=batches.COMPLETION_LEN,
        gradient_accumulation_steps=2,
        steps_per_generation=2,
        num_iterations=2,  # two optimizer steps per rollout: micro-steps 0-1 and 2-3
        batch_ratio_scope=scope,
        **EPS,
    )
    args = ECHOConfig(**cpu_config_kwargs(tmp_path / scope, **{**settings, **overrides}))
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


def _union_inputs(trainer, tokenizer, scenario: str | None) -> dict:
    """The 16 rows with the behaviour log-probs of `scenario`'s log-ratios; None: the current log-probs (the rollout's
    first optimizer step, one forward over all 16 rows as TRL scores the generation batch)."""
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logps, _, _ = trainer._forward_logps_and_entropies(trainer.model, batch)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
    inputs = {key: batch[key] for key in keys}
    inputs["advantages"] = inputs["advantages"].double()
    log_ratio = 0.0 if scenario is None else batches.log_ratios(scenario).double()
    inputs["old_per_token_logps"] = (logps - log_ratio).detach()
    return inputs


def _half(inputs: dict, part: int) -> dict:
    rows = slice(part * batches.HALF, (part + 1) * batches.HALF)
    return {k: (v if k == "num_items_in_batch" else v[rows]) for k, v in inputs.items()}


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class Step(NamedTuple):
    loss: torch.Tensor  # summed over the micro-batches
    grads: dict  # accumulated
    metrics: dict
    forwards: int  # calls of the loss forward (`_forward_logps_and_entropies`), the step totals' included


def _accumulated_step(trainer, inputs, step: int = 1) -> Step:
    """Optimizer step `step` (0: the rollout's first; 1: its second, the default) of two micro-batches through TRL's
    buffer, with the forwards counted."""
    trainer.model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    trainer.state.global_step = step
    trainer._step_totals = None  # a fresh trainer state: other tests reuse (global_step, micro-step) pairs
    trainer._buffered_inputs = [_half(inputs, 0), _half(inputs, 1)]
    forward, calls = trainer._forward_logps_and_entropies, []

    def counted(model, batch):
        calls.append(len(batch["completion_mask"]))
        return forward(model, batch)

    trainer._forward_logps_and_entropies = counted
    total = 0.0
    try:
        for micro_step in (0, 1):
            trainer._step = 2 * step + micro_step
            loss = trainer._compute_loss(trainer.model, trainer._buffered_inputs[micro_step])
            loss.backward()
            total = total + loss.detach()
    finally:
        trainer._forward_logps_and_entropies = forward
        trainer._buffered_inputs, trainer._step = None, 0
    return Step(total, _grads(trainer.model), dict(trainer._metrics["train"]), len(calls))


@contextmanager
def _with_the_forward():
    """The step totals from the extra forward on every step, as before the first step's shortcut."""
    with mock.patch.object(ECHOTrainer, "_why_step_totals_need_a_forward", lambda self, batches: "forced"):
        yield


def _whole_step_reference(trainer, inputs, weights=None):
    """The objective formed over the whole step: R over all 16 rows, dapo aggregation, one backward; `weights`
    (a function of the step's log-probs and entropies) gives the per-token loss multipliers."""
    trainer.model.zero_grad(set_to_none=True)
    logps, entropies = trainer._forward_logps_and_entropies(trainer.model, inputs)[:2]
    mask = inputs["completion_mask"].double()
    old = inputs.get("old_per_token_logps")
    out = echo_loss(
        logps,
        logps.detach() if old is None else old,
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
    loss, grads, metrics, forwards = _accumulated_step(trainer, inputs)
    assert forwards == 4  # the rollout's second step: the extra forward of each micro-batch runs
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    assert max(g.abs().max().item() for g in ref_grads.values()) > 1e-2  # a real gradient
    assert _max_diff(grads, ref_grads) < ATOL
    # both micro-batches use the step's R
    step_ratio = ref_metrics["echo/batch_ratio"].item()
    assert metrics["echo/batch_ratio"] == pytest.approx([step_ratio, step_ratio], abs=1e-6)

    micro_loss, micro_grads, micro_metrics, _ = _accumulated_step(trainers["micro_batch"], inputs)
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
    _accumulated_step(trainer, inputs, step=0)
    _accumulated_step(trainer, inputs, step=1)
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
    clean_loss, clean_grads, *_ = _accumulated_step(trainer, inputs)
    padding = inputs["completion_mask"] == 0
    assert padding.any()
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"].masked_fill(padding, bad)
    loss, grads, *_ = _accumulated_step(trainer, inputs)
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
    "off_policy_mask+vllm_is": ({"off_policy_mask_threshold": OFF_POLICY_THRESHOLD}, "token_truncate"),
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
    loss, grads, metrics, forwards = _accumulated_step(trainer, inputs)

    assert forwards == 4
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


# ---------------------------------------------------------------- the rollout's first optimizer step
#: Where the buffer gives the first step's totals (no extra forward), and where the forward stays (docs/echo.md).
FIRST_STEP_SKIPS = ("plain", "rounded", *(f"vllm_is_{mode}" for mode in VLLM_IS_MODES), "off_policy_mask+vllm_is")
ROUNDING = 1e-12  # "rounded": old log-probs off the current ones by about this, as two forwards may differ
FIRST_STEP_FORWARDS = ("entropy_mask", "all_three")  # the entropy mask needs the current entropies


def _assert_same_step(a: Step, b: Step) -> float:
    """Loss and accumulated gradients equal to 1e-10; returns the largest gradient difference."""
    torch.testing.assert_close(a.loss, b.loss, atol=ATOL, rtol=0)
    diff = _max_diff(a.grads, b.grads)
    assert diff < ATOL
    return diff


@pytest.mark.parametrize("name", [*FIRST_STEP_SKIPS, *FIRST_STEP_FORWARDS])
def test_first_step_after_a_rollout_equals_the_step_with_the_forward(setup, weighted, name, capsys):
    """On the rollout's first step (old log-probs = the current ones, up to the rounding of two forwards) the loss
    and the accumulated gradients equal those with the extra forward and the whole-step objective's, to 1e-10; the
    extra forward is skipped (one forward per micro-batch) unless the entropy mask needs it."""
    tokenizer = setup[0]
    trainer = setup[1]["step"] if name in ("plain", "rounded") else weighted[1][name]
    inputs = _weighted_inputs(trainer, tokenizer, None)
    if name == "rounded":
        noise = torch.randn(inputs["completion_mask"].shape, generator=torch.Generator().manual_seed(3))
        inputs["old_per_token_logps"] = inputs["old_per_token_logps"] + ROUNDING * noise.double()
    weights = _reference_weights(trainer, inputs)
    ref = Step(*_whole_step_reference(trainer, inputs, weights), forwards=1)
    first = _accumulated_step(trainer, inputs, step=0)
    with _with_the_forward():
        forced = _accumulated_step(trainer, inputs, step=0)

    assert abs(ref.metrics["echo/batch_ratio"].item() - 1.0) < 1e-11  # log r = 0 up to rounding
    assert ref.metrics["echo/batch_clipped"].item() == 0.0  # R = 1: the coupling of Eq. 34 spans both micro-batches
    assert max(g.abs().max().item() for g in ref.grads.values()) > 1e-2  # a real gradient
    if name not in ("plain", "rounded"):  # the multipliers matter on this batch
        assert _max_diff(ref.grads, _whole_step_reference(trainer, inputs)[1]) > 1e-4
    assert (first.forwards, forced.forwards) == ((2 if name in FIRST_STEP_SKIPS else 4), 4)
    diff = _assert_same_step(first, forced)
    _assert_same_step(first, ref)
    _assert_same_step(forced, ref)
    if name in FIRST_STEP_SKIPS:  # the shortcut's log R is exactly 0
        assert first.metrics["echo/batch_ratio"] == [1.0, 1.0]
    with capsys.disabled():
        print(f"\n{name}: first step without / with the extra forward: max |grad diff| {diff:.1e}, "
              f"|loss diff| {abs(first.loss - forced.loss).item():.1e}")  # fmt: skip


def test_first_step_on_policy_needs_no_forward(setup):
    """On-policy TRL buffers no old log-probs: the ratio is exactly 1 with or without the forward."""
    tokenizer, trainers = setup
    trainer = trainers["step"]
    inputs = _union_inputs(trainer, tokenizer, None)
    del inputs["old_per_token_logps"]
    ref = Step(*_whole_step_reference(trainer, inputs), forwards=1)
    first = _accumulated_step(trainer, inputs, step=0)
    with _with_the_forward():
        forced = _accumulated_step(trainer, inputs, step=0)
    assert (first.forwards, forced.forwards) == (2, 4)
    assert _assert_same_step(first, forced) < ATOL
    _assert_same_step(first, ref)


def _otb_inputs(trainer, tokenizer, energy: bool) -> dict:
    """`_union_inputs` of the first step with OTB's batch fields: raw rewards and (off-policy) the behaviour energy."""
    inputs = _union_inputs(trainer, tokenizer, None)
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    inputs["rewards"] = batch["rewards_per_func"][:, 0].double()
    if energy:
        gen = torch.Generator().manual_seed(7)
        mask = inputs["completion_mask"].double()
        inputs["old_per_token_energy"] = torch.rand(mask.shape, generator=gen, dtype=torch.float64) * mask
    return inputs


def test_first_step_on_otb_advantages(tmp_path, setup):
    """OTB's advantages come from the behaviour energy in the buffer: the first step needs no forward, and equals the
    step with the forward. On-policy (no energy buffered) they need the training forward's: it stays."""
    tokenizer = setup[0]
    trainer = _trainer(tmp_path, tokenizer, "step", advantage_estimator="otb")
    inputs = _otb_inputs(trainer, tokenizer, energy=True)
    first = _accumulated_step(trainer, inputs, step=0)
    with _with_the_forward():
        forced = _accumulated_step(trainer, inputs, step=0)
    assert (first.forwards, forced.forwards) == (2, 4)
    _assert_same_step(first, forced)
    assert max(g.abs().max().item() for g in first.grads.values()) > 1e-2
    on_policy = _otb_inputs(trainer, tokenizer, energy=False)
    trainer._buffered_inputs, trainer._step = [_half(on_policy, 0), _half(on_policy, 1)], 0
    try:
        reason = trainer._why_step_totals_need_a_forward(trainer._buffered_inputs)
    finally:
        trainer._buffered_inputs = None
    assert "advantage_estimator='otb'" in reason


def test_which_steps_keep_the_extra_forward(setup, weighted):
    """The reasons the step totals need a forward; None (no forward) on each rollout's first step otherwise."""
    tokenizer, trainers = setup
    inputs = _union_inputs(trainers["step"], tokenizer, None)
    halves = [_half(inputs, 0), _half(inputs, 1)]

    def why(trainer, micro_step: int, buffered: bool = True) -> str | None:
        trainer._buffered_inputs, trainer._step = (halves if buffered else None), micro_step
        try:
            return trainer._why_step_totals_need_a_forward(halves)
        finally:
            trainer._buffered_inputs, trainer._step = None, 0

    plain = trainers["step"]
    assert [why(plain, k) for k in (0, 4, 8)] == [None] * 3  # the first step of each rollout (4 micro-steps each)
    assert all("later optimizer step" in why(plain, k) for k in (2, 6))
    assert "outside TRL's training loop" in why(plain, 0, buffered=False)
    assert "entropy mask" in why(weighted[1]["entropy_mask"], 0)
    assert why(weighted[1]["off_policy_mask+vllm_is"], 0) is None


def test_a_step_of_one_micro_batch_runs_no_extra_forward(tmp_path, setup):
    """With one micro-batch per optimizer step, the step is the processes' micro-batch: its own forward gives R, on
    every step of the rollout, and the result is "micro_batch"'s (one process) to 1e-10."""
    tokenizer = setup[0]
    results = {}
    for scope in ("step", "micro_batch"):
        trainer = _trainer(tmp_path, tokenizer, scope, gradient_accumulation_steps=1)
        trainer.current_gradient_accumulation_steps = 1
        inputs = _union_inputs(trainer, tokenizer, "mixed")
        trainer._buffered_inputs = [_half(inputs, 0), _half(inputs, 1)]
        forward, calls, steps = trainer._forward_logps_and_entropies, [], []
        trainer._forward_logps_and_entropies = lambda model, batch, f=forward, c=calls: c.append(1) or f(model, batch)
        for k in range(4):  # two rollouts' micro-steps: each one optimizer step
            trainer.model.zero_grad(set_to_none=True)
            trainer.state.global_step, trainer._step = k, k
            loss = trainer._compute_loss(trainer.model, trainer._buffered_inputs[k % 2])
            loss.backward()
            steps.append(Step(loss.detach(), _grads(trainer.model), {}, 0))
        trainer._buffered_inputs, trainer._step = None, 0
        results[scope] = steps, len(calls)
    assert results["step"][1] == results["micro_batch"][1] == 4  # one forward per micro-batch
    for ours, micro in zip(results["step"][0], results["micro_batch"][0]):
        _assert_same_step(ours, micro)
