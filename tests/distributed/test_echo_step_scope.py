"""ECHO `batch_ratio_scope="step"` through the trainer: one optimizer step of 2 accumulated micro-batches per process
on 1 process and on 2 CPU processes (gloo), `workers/echo_step.py`.

Both runs train the same 16 rows in one optimizer step, split differently into micro-batches (TRL shuffles the
generation batch). "step" forms R and the Eq. 34 coupling over the whole step, so the gradients entering the optimizer
agree (float32, TRL's fused LM head; `atol=1e-6, rtol=1e-5`) and the logged R is the step's; "micro_batch" depends on
the split ("split" log-ratios: each micro-batch's R differs), so it is checked to differ. "step_weighted" adds TRL's
off-policy mask and vLLM IS weights (`token_mask`): the gradient still does not depend on the split, and differs from
the unweighted one. The step is the rollout's first: these cases run with the extra forward, as their fixed
log-ratios make a behaviour policy other than the current one; "step_first" takes the current log-probs as the
behaviour ones and runs without it (docs/echo.md): R is 1 and the gradient equals the forward's
("step_first_forward") and does not depend on the split.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import batches
from tests.distributed.harness import launch_worlds

ATOL, RTOL = 1e-6, 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch_worlds("echo_step.py", tmp_path_factory.mktemp("echo_step"), timeout=600)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_step_scope_gradient_does_not_depend_on_the_split(runs):
    one, two = runs[1][1], runs[2][1]
    grads_one, grads_two = one[0]["step"]["grads"], two[0]["step"]["grads"]
    assert max(g.abs().max().item() for g in grads_one.values()) > 1e-2
    for name in grads_one:
        torch.testing.assert_close(grads_two[name], grads_one[name], atol=ATOL, rtol=RTOL, msg=name)
    # the logged R is the whole step's on every rank and micro-batch
    mask = batches.group_batch(100, 0)["completion_mask"].float()
    expected = torch.tensor(batches.echo_log_batch_ratio(batches.log_ratios("split"), mask)).exp().item()
    for world in (1, 2):
        for rank_result in runs[world][0]:
            assert rank_result["cases"]["step"]["batch_ratio"] == pytest.approx([expected], abs=1e-5)


def test_step_scope_with_loss_multipliers_does_not_depend_on_the_split(runs):
    one, two = runs[1][1][0]["step_weighted"]["grads"], runs[2][1][0]["step_weighted"]["grads"]
    assert max(g.abs().max().item() for g in one.values()) > 1e-2
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=ATOL, rtol=RTOL, msg=name)
    assert _max_diff(one, runs[1][1][0]["step"]["grads"]) > 1e-3  # the multipliers act on this batch
    expected = runs[1][0][0]["cases"]["step"]["batch_ratio"]  # R does not depend on the multipliers
    for world in (1, 2):
        for rank_result in runs[world][0]:
            assert rank_result["cases"]["step_weighted"]["batch_ratio"] == pytest.approx(expected, abs=1e-5)


def test_micro_batch_scope_depends_on_the_split(runs):
    grads_one, grads_two = runs[1][1][0]["micro_batch"]["grads"], runs[2][1][0]["micro_batch"]["grads"]
    assert _max_diff(grads_one, grads_two) > 1e-4


def test_first_step_without_the_extra_forward_does_not_depend_on_the_split(runs):
    """The rollout's first step, behaviour policy = the current one: the shortcut's totals are summed over the
    micro-batches and all-reduced over the processes like the forward's, so the gradient is the forward's on 1 and
    2 processes, and R is 1."""
    one = runs[1][1][0]["step_first"]["grads"]
    assert max(g.abs().max().item() for g in one.values()) > 1e-2
    for world in (1, 2):
        ours, forward = runs[world][1][0]["step_first"]["grads"], runs[world][1][0]["step_first_forward"]["grads"]
        for name in one:
            torch.testing.assert_close(ours[name], one[name], atol=ATOL, rtol=RTOL, msg=name)
            torch.testing.assert_close(ours[name], forward[name], atol=ATOL, rtol=RTOL, msg=name)
        for rank_result in runs[world][0]:
            assert rank_result["cases"]["step_first"]["batch_ratio"] == [1.0]
            assert rank_result["cases"]["step_first_forward"]["batch_ratio"] == pytest.approx([1.0], abs=1e-5)
