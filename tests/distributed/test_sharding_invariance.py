"""Sharding invariance: one optimizer step on 2 CPU processes (gloo) equals one process over the union of the data.

`workers/one_step.py` runs every trainer configuration for one SGD step on a FIXED generation batch
(`batches.group_batch`: 4 groups of 4, whole groups per rank, unequal token counts per rank) with fixed off-policy
log-ratios (`batches.log_ratios`); it is launched once with 1 process and once with 2. Every registered method runs
its own case under its spec's `acting_settings`, and its mechanism must act there in both launches (so the invariance
is tested where the method differs from GRPO); the variant cases check that the token clip acts.

Compared, per configuration: the logged loss, the gradient entering the optimizer (all-reduced by DDP), the updated
parameters and the logged `grad_norm`. Tolerance: float32 throughout (TRL's fused LM head computes log-probs in
float32, so a float64 model would not buy precision); the two runs differ only by the batch split of the forward
and the order of float32 sums, measured at <= 6e-8 absolute on gradients of size ~0.1-0.5, asserted at
`atol=1e-6, rtol=1e-5`.

Invariant: every registered method's own case (a new one included), the base trainer with grpo / dr_grpo / luspo,
ECHO `batch_ratio_scope="global"`, DFPO (min_replace, orth_proj, orth_proj_qp, none), and ECHO (default "step"
scope), CTPO and GRPO-fix on OTB's advantages (`advantage_estimator="otb"`). Not invariant, pinned with the exact
reason:
  * `loss_type="bnpo"`: each process divides by ITS token count and DDP averages the processes, i.e.
    (S0/N0 + S1/N1)/2 instead of (S0+S1)/(N0+N1) (TRL's documented semantics: local normaliser).
  * ECHO `batch_ratio_scope="micro_batch"`: R is each process's own. With the halves' R clipped and the union's not,
    loss and gradient differ; with no R clipped the loss is equal (C = 1) but the gradient differs, through the
    batch-coupling term of Eq. 34 (each process adds its own L_k / N_k instead of the union's).
The logged clip fractions are sharding-invariant too (`test_logged_clip_fractions_are_sharding_invariant`): every
objective returns its clip indicators per token or per sequence and the base reduces them token-weighted, as TRL.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import batches
from tests.distributed.harness import case_of, launch_worlds
from tests.distributed.workers import one_step
from tests.selection import tested_methods
from trl_groupopt import get_method

ATOL, RTOL = 1e-6, 1e-5
LEARNING_RATE = 0.5  # workers/one_step.py

#: Not sharding invariant, pinned with the exact reason (module docstring); every other case of workers/one_step.py
#: (all registered methods, a new one included) must be invariant.
PINNED = ("grpo/bnpo", "echo/micro_batch/split", "echo/micro_batch/unclipped")
NOT_INVARIANT = [name for name in PINNED if name in one_step.CASES]  # (the methods tests.selection selects)
INVARIANT = [name for name in one_step.CASES if name not in NOT_INVARIANT]
OWN_CASES = [name for name, (method, _, _) in one_step.CASES.items() if name == method]
NO_TOKEN_CLIP = {"echo/global/unclipped", "echo/micro_batch/unclipped"}  # log-ratios too small for the token clip


def test_cases_cover_the_registry():
    """Every registered method has its own case (case names start with the registry name, see workers/one_step.py)."""
    methods = {name.split("/")[0] for name in one_step.CASES}
    assert methods == set(tested_methods()) and methods <= set(one_step.CASES)
    assert set(PINNED) <= {name for cases in one_step.VARIANTS.values() for name in cases}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world_size: (per-rank JSON results, per-rank tensors)}, both launches running concurrently."""
    return launch_worlds("one_step.py", tmp_path_factory.mktemp("one_step"), timeout=600)


def _max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max((a[n] - b[n]).abs().max().item() for n in a)


def _assert_tensors_close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys() and a
    for n in a:
        torch.testing.assert_close(b[n], a[n], atol=ATOL, rtol=RTOL, msg=lambda m, n=n: f"{what} {n}: {m}")


def test_every_configuration_ran(runs):
    for world_size in (1, 2):
        results, _ = runs[world_size]
        assert [r["world_size"] for r in results] == [world_size] * world_size
        for result in results:
            assert sorted(result["cases"]) == sorted(INVARIANT + NOT_INVARIANT)


def test_ranks_hold_identical_parameters(runs):
    """DDP sanity: after the step both ranks hold bit-identical parameters and gradients."""
    for name in INVARIANT + NOT_INVARIANT:
        (_, rank0), (_, rank1) = case_of(runs, 2, name, 0), case_of(runs, 2, name, 1)
        assert _max_abs_diff(rank0["params"], rank1["params"]) == 0.0, name
        assert _max_abs_diff(rank0["grads"], rank1["grads"]) == 0.0, name


@pytest.mark.parametrize("name", INVARIANT + NOT_INVARIANT)
def test_step_is_a_real_sgd_step_with_clipping(runs, name):
    """The checks below can fail: the gradient is not small, the update is exactly `-lr * grad` (SGD, no momentum,
    no clipping by norm), and in a method's own case its mechanism acts (the spec's definition, on the logged step),
    in a variant the token/sequence clip acts (except in the scenarios built to avoid it)."""
    for world_size in (1, 2):
        result, tensors = case_of(runs, world_size, name)
        grads, params, initial = tensors["grads"], tensors["params"], tensors["initial"]
        assert max(g.abs().max().item() for g in grads.values()) > 1e-2, name
        for n in params:
            torch.testing.assert_close(params[n], initial[n] - LEARNING_RATE * grads[n], atol=1e-7, rtol=0)
        mechanism = get_method(one_step.CASES[name][0]).mechanism
        if name in OWN_CASES and mechanism is not None:
            logged = {key: result["logged"].get(key) for key in mechanism.keys}
            assert mechanism.acted_on(result["logged"]), (name, world_size, mechanism.name, logged)
            continue
        if name in OWN_CASES and "clip_ratio/region_mean" not in result["logged"]:
            continue  # an objective without a clip and without a report (one may return no metric at all)
        region = result["logged"]["clip_ratio/region_mean"]
        assert (region == 0.0) if name in NO_TOKEN_CLIP else (region > 0.0), (name, region)


@pytest.mark.parametrize("name", INVARIANT)
def test_two_processes_equal_one_process_over_the_union(runs, name):
    one, one_tensors = case_of(runs, 1, name)
    two, two_tensors = case_of(runs, 2, name)
    assert two["logged"]["loss"] == pytest.approx(one["logged"]["loss"], abs=ATOL, rel=RTOL)
    assert two["logged"]["grad_norm"] == pytest.approx(one["logged"]["grad_norm"], abs=ATOL, rel=RTOL)
    _assert_tensors_close(one_tensors["grads"], two_tensors["grads"], f"{name} gradient")
    _assert_tensors_close(one_tensors["params"], two_tensors["params"], f"{name} parameters")
    # the logged loss is the processes' mean of their local losses (Trainer's all-gather + mean)
    locals_ = [case_of(runs, 2, name, rank)[0]["local_loss"] for rank in range(2)]
    assert two["logged"]["loss"] == pytest.approx(sum(locals_) / 2, abs=1e-7)


def test_echo_global_scope_batch_ratio_is_the_unions(runs):
    """In "global" scope every process logs the union's R and clip decision; the scenarios clip R as designed."""
    expected_clipped = {"echo/global/split": 0.0, "echo/global/shifted": 1.0, "echo/global/unclipped": 0.0}
    for name, clipped in expected_clipped.items():
        one, _ = case_of(runs, 1, name)
        two, _ = case_of(runs, 2, name)
        assert one["logged"]["echo/batch_clipped"] == two["logged"]["echo/batch_clipped"] == clipped, name
        assert two["logged"]["echo/batch_ratio"] == pytest.approx(one["logged"]["echo/batch_ratio"], rel=1e-6)


def test_bnpo_is_not_sharding_invariant_local_token_normaliser(runs):
    """bnpo divides by the LOCAL token count; DDP then averages the processes: the 2-process loss is
    (S0/N0 + S1/N1) / 2, the union's (S0 + S1) / (N0 + N1). The halves hold different token counts here."""
    one, one_tensors = case_of(runs, 1, "grpo/bnpo")
    two, two_tensors = case_of(runs, 2, "grpo/bnpo")
    mask = batches.group_batch(64, 0)["completion_mask"]  # token counts do not depend on the vocabulary
    counts = [mask[: batches.HALF].sum().item(), mask[batches.HALF :].sum().item()]
    assert counts[0] != counts[1]
    local = [case_of(runs, 2, "grpo/bnpo", rank)[0]["local_loss"] for rank in range(2)]  # S_k / N_k
    sums = [loss * count for loss, count in zip(local, counts)]
    assert two["logged"]["loss"] == pytest.approx(sum(local) / 2, abs=1e-7)
    assert one["logged"]["loss"] == pytest.approx(sum(sums) / sum(counts), abs=ATOL, rel=RTOL)  # the reason, exactly
    assert abs(two["logged"]["loss"] - one["logged"]["loss"]) > 1e-3
    assert _max_abs_diff(one_tensors["grads"], two_tensors["grads"]) > 1e-3


def test_echo_micro_batch_scope_is_not_sharding_invariant(runs):
    """ECHO's "micro_batch" scope forms R over each process's tokens (documented; "global" is the invariant one).

    split: the halves' mean log-ratios are +-0.3, so each process clips its own R while the union's R (~1) is not
    clipped: loss and gradient differ. unclipped: no R is clipped anywhere, so C = 1 and the loss is the same, but
    the gradient still differs: Eq. 34's coupling term is L_k / N_k of each process instead of the union's L / N.
    In one process the two scopes are the same computation.
    """
    one, one_tensors = case_of(runs, 1, "echo/micro_batch/split")
    two, two_tensors = case_of(runs, 2, "echo/micro_batch/split")
    assert one["logged"]["echo/batch_clipped"] == 0.0 and two["logged"]["echo/batch_clipped"] == 1.0
    assert abs(two["logged"]["loss"] - one["logged"]["loss"]) > 1e-3
    assert _max_abs_diff(one_tensors["grads"], two_tensors["grads"]) > 1e-2

    one, one_tensors = case_of(runs, 1, "echo/micro_batch/unclipped")
    two, two_tensors = case_of(runs, 2, "echo/micro_batch/unclipped")
    assert one["logged"]["echo/batch_clipped"] == two["logged"]["echo/batch_clipped"] == 0.0
    assert two["logged"]["loss"] == pytest.approx(one["logged"]["loss"], abs=ATOL, rel=RTOL)
    assert _max_abs_diff(one_tensors["grads"], two_tensors["grads"]) > 1e-4

    for scenario in ("split", "unclipped"):
        (micro, micro_tensors), (glob, glob_tensors) = (
            case_of(runs, 1, f"echo/micro_batch/{scenario}"),
            case_of(runs, 1, f"echo/global/{scenario}"),
        )
        assert micro["logged"]["loss"] == glob["logged"]["loss"]
        assert _max_abs_diff(micro_tensors["grads"], glob_tensors["grads"]) == 0.0


CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


@pytest.mark.parametrize("name", INVARIANT + [name for name in NOT_INVARIANT if name == "grpo/bnpo"])
def test_logged_clip_fractions_are_sharding_invariant(runs, name):
    """TRL's `clip_ratio/*_mean` is a global token-weighted fraction (all-reduced sums), so it does not depend on the
    sharding when the losses do not. Every objective returns per-token (or, DFPO, per-sequence over equal
    per-process sequence counts) clip indicators reduced with `_global_masked_mean`; the processes hold different
    token counts here (49 vs 29 tokens, see `batches.group_batch`), so unweighted averaging would fail."""
    one, _ = case_of(runs, 1, name)
    two, _ = case_of(runs, 2, name)
    for key in CLIP_KEYS:  # an objective without a clip logs none (it may return no metric at all)
        assert (key in two["logged"]) == (key in one["logged"]), (name, key)
        if key in one["logged"]:
            assert two["logged"][key] == pytest.approx(one["logged"][key], abs=1e-6), (name, key)
