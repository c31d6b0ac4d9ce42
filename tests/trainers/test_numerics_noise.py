"""The forward's noise where it acts (`trl_groupopt/trainer/numerics.py`, through `GroupOptTrainer._compute_loss`): on
the first optimizer step of a rollout the token log-ratio is logged as `numerics/log_ratio_rms` with its share of
each clip window; exactly 0 for the same forward in fp32, nonzero for a differently composed bf16 forward; not
logged once the policy moved, nor on-policy; one warning when the noise is a large share of a window; no host sync.
The full training run (exactly 0 in fp32, first steps only): tests/e2e/test_numerics_noise_training.py."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.helpers import _forward, clone_model, method_trainer, random_batch, tiny_model
from tests.sync_counter import SyncCounter

# the logged names (docs/ctpo.md, docs/dfpo.md), spelled out: each test runs, and fails, on a trainer without them
RMS_METRIC, SHARE_METRIC = "numerics/log_ratio_rms", "numerics/noise_share/"

OFF_POLICY = dict(steps_per_generation=2, gradient_accumulation_steps=1)  # 2 optimizer steps per rollout


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer, seed=3)


def _batch(tokenizer, trainer, old_logps=None):
    """A micro-batch as TRL buffers it; old log-probs: the trainer's own forward of it (or `old_logps(batch)`)."""
    batch = random_batch(tokenizer, batch_size=4, completion_len=12, seed=1, group_size=4)
    inputs = {k: v for k, v in batch.items() if not k.endswith("_noise")}
    with torch.no_grad():
        inputs["old_per_token_logps"] = old_logps(inputs) if old_logps else _forward(trainer, trainer.model, inputs)[0]
    return inputs


def _loss_metrics(trainer, inputs, micro_step: int = 0, global_step: int = 0) -> dict[str, list[float]]:
    """The train metrics one `_compute_loss` call logs, at TRL's micro-step and the optimizer step given."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer._step, trainer.state.global_step = micro_step, global_step
    trainer._metrics["train"].clear()
    trainer._compute_loss(trainer.model, dict(inputs)).backward()
    return dict(trainer._metrics["train"])


def _row_by_row_logps(trainer, inputs):
    """The behaviour log-probs of a differently composed batch: each row alone, cut to its own completion length
    (what a trimmed or padding-free layout scores); 0 beyond it."""
    out = torch.zeros(inputs["completion_mask"].shape)
    for row, length in enumerate(inputs["completion_mask"].sum(-1).tolist()):
        part = {k: v[row : row + 1] for k, v in inputs.items() if torch.is_tensor(v) and v.dim() == 2}
        part["completion_ids"], part["completion_mask"] = (
            part[k][:, :length] for k in ("completion_ids", "completion_mask")
        )
        out[row, :length] = _forward(trainer, trainer.model, part)[0][0]
    return out


def test_fp32_same_forward_logs_exactly_zero_and_each_window(tmp_path, tokenizer, model):
    trainer = method_trainer("ctpo", tmp_path, clone_model(model), tokenizer, **OFF_POLICY)
    metrics = _loss_metrics(trainer, _batch(tokenizer, trainer))
    assert metrics[RMS_METRIC] == [0.0]  # fp32, the same rows and widths: the two forwards agree bit for bit
    assert metrics[SHARE_METRIC + "prefix_clip"] == [0.0]


def test_bf16_differently_composed_forward_is_nonzero_and_its_shares_match(tmp_path, tokenizer, model):
    """bf16 weights, behaviour log-probs scored row by row: the loss forward's log-ratio is pure rounding noise."""
    from trl_groupopt.core.numerics import log_ratio_rms, noise_share
    from trl_groupopt.trainer.numerics import NOISE_WARNING_SHARE, clip_windows

    bf16 = clone_model(model).to(torch.bfloat16)
    trainer = method_trainer("dfpo", tmp_path, bf16, tokenizer, **OFF_POLICY)
    inputs = _batch(tokenizer, trainer, lambda batch: _row_by_row_logps(trainer, batch))
    metrics = _loss_metrics(trainer, inputs)
    (rms,) = metrics[RMS_METRIC]
    with torch.no_grad():
        noise = _forward(trainer, trainer.model, inputs)[0] - inputs["old_per_token_logps"]
    mask = inputs["completion_mask"]
    assert rms > 0 and rms == pytest.approx(log_ratio_rms(noise, mask).item(), rel=1e-5)
    (window,) = clip_windows(trainer.args)  # DFPO: GSPO's sequence clip (3e-4 / 4e-4)
    assert window.level == "sequence" and window.width == pytest.approx(3e-4, rel=1e-3)
    share = metrics[SHARE_METRIC + "sequence_clip"][0]
    assert share == pytest.approx(noise_share(noise, mask, window).item(), rel=1e-5) and share > NOISE_WARNING_SHARE


def test_logged_only_while_the_policy_has_not_moved(tmp_path, tokenizer, model):
    trainer = method_trainer("grpo", tmp_path, clone_model(model), tokenizer, **OFF_POLICY)
    inputs = _batch(tokenizer, trainer)
    assert RMS_METRIC in _loss_metrics(trainer, inputs, micro_step=0, global_step=0)  # the rollout's first step
    assert RMS_METRIC not in _loss_metrics(trainer, inputs, micro_step=1, global_step=1)  # its second: moved
    assert RMS_METRIC in _loss_metrics(trainer, inputs, micro_step=2, global_step=1)  # the next rollout's first
    on_policy = {k: v for k, v in inputs.items() if k != "old_per_token_logps"}  # TRL ran no behaviour forward
    assert RMS_METRIC not in _loss_metrics(trainer, on_policy, micro_step=4, global_step=2)


@pytest.mark.parametrize(("method", "warns"), [("dfpo", True), ("grpo", False)])
def test_warns_once_when_the_noise_is_a_large_share_of_the_window(tmp_path, tokenizer, model, method, warns):
    """Log-ratio noise of rms 0.01: over 50x GSPO/DFPO's sequence clip, 5% of TRL's token clip (log 1.2)."""
    trainer = method_trainer(method, tmp_path, clone_model(model), tokenizer, **OFF_POLICY)
    noise = 0.01 * torch.randn(4, 12, generator=torch.Generator().manual_seed(0))
    inputs = _batch(tokenizer, trainer, lambda batch: _forward(trainer, trainer.model, batch)[0] - noise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rollout in range(3):
            _loss_metrics(trainer, inputs, micro_step=2 * rollout, global_step=rollout)
            trainer.log({})  # TRL's log: the metrics averaged, then the callbacks' `on_log`
    from trl_groupopt.trainer.numerics import clip_windows

    noisy = [str(w.message) for w in caught if SHARE_METRIC in str(w.message)]
    assert trainer.state.log_history[-1][SHARE_METRIC + clip_windows(trainer.args)[0].name] > 0
    assert len(noisy) == (1 if warns else 0), noisy
    if warns:
        assert "sequence_clip" in noisy[0] and "fp32" in noisy[0] and "epsilon" in noisy[0]


@pytest.mark.parametrize("method", ["grpo", "ctpo", "echo"])
def test_the_noise_metrics_add_no_host_sync(tmp_path, tokenizer, model, method):
    """The micro-batch's syncs with the noise measured (first step) equal those without (the policy moved)."""
    trainer = method_trainer(method, tmp_path, clone_model(model), tokenizer, **OFF_POLICY)
    inputs = _batch(tokenizer, trainer)
    counts = []
    for micro_step, global_step in ((0, 0), (1, 1)):
        trainer._step, trainer.state.global_step = micro_step, global_step
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        with SyncCounter() as syncs:
            trainer._compute_loss(trainer.model, dict(inputs)).backward()
        counts.append((syncs.total, RMS_METRIC in trainer._metrics["train"]))
        trainer._metrics["train"].clear()
    assert counts[0][1] and not counts[1][1]  # measured, then not
    assert counts[0][0] == counts[1][0], counts


def test_default_windows_follow_trls_resolution_and_a_zero_epsilon_has_none(tmp_path):
    """TRL's token clip [1 - epsilon, 1 + epsilon_high] (epsilon_high None: epsilon), GSPO's at sequence level; a
    zero-width clip (epsilon=0, which TRL accepts) measures nothing rather than refusing the config."""
    import math

    from trl import GRPOConfig

    from tests.helpers import cpu_config_kwargs
    from trl_groupopt.trainer.numerics import clip_windows

    (token,) = clip_windows(GRPOConfig(**cpu_config_kwargs(tmp_path, epsilon=0.2, epsilon_high=0.28)))
    assert (token.name, token.level, token.width) == ("token_clip", "token", pytest.approx(-math.log(0.8)))
    (sequence,) = clip_windows(GRPOConfig(**cpu_config_kwargs(tmp_path, importance_sampling_level="sequence")))
    assert (sequence.name, sequence.width) == ("sequence_clip", pytest.approx(math.log(1.2)))
    assert clip_windows(GRPOConfig(**cpu_config_kwargs(tmp_path, epsilon=0.0))) == ()
