"""Gradient-accumulation invariance (one process): one micro-batch of 2k sequences against two accumulated
micro-batches of k, for every loss_type and every method.

`_compute_loss` is driven directly (as tests/trainers/test_base_parity.py does) on the fixed group batch of
`tests.distributed.batches` (4 groups of 4; each half holds two whole groups, 49 vs 29 tokens) with fixed off-policy
log-ratios. Every method runs under its spec's `acting_settings` (the config under which its mechanism acts on such
a batch), and the test checks that the mechanism did act on the big batch: the invariance is tested where the method
differs from GRPO. Big batch: `current_gradient_accumulation_steps = steps_per_generation = 1`.
Accumulated: both set to 2 (TRL's default `steps_per_generation = gradient_accumulation_steps`; dapo's normaliser
reads both), `num_items_in_batch` = tokens of the whole generation batch in both runs. Compared: the big loss
against the sum of the two micro-batch losses, and the big gradient against the sum of the two gradients
(float32, `atol=1e-6, rtol=1e-5`; measured differences ~1e-8).

| configuration                 | invariant | why                                                                          |
|-------------------------------|-----------|------------------------------------------------------------------------------|
| grpo                          | yes       | mean over sequences / GA: a mean of equal-size means is the mean             |
| dr_grpo                       | yes       | sum / (B_micro * max_completion_length) / GA = sum / (B * L)                  |
| dapo                          | yes       | sum / (num_items_in_batch * GA / steps_per_generation): one global constant  |
| luspo                         | yes       | mean over sequences of their token sums / GA, equal-size micro-batches        |
| bnpo, unequal token counts    | NO        | each micro-batch divides by its own token count: (S1/N1 + S2/N2)/2           |
| bnpo, equal token counts      | yes       | N1 = N2 = N/2                                                                |
| ECHO (either scope)           | NO        | R is formed per micro-batch (the "global" scope reduces over processes, not  |
|                               |           | accumulation steps): clipped halves change the loss; unclipped, the loss is  |
|                               |           | equal but Eq. 34's coupling term is each micro-batch's own L_k / N_k         |
| DFPO (4 transforms), GRPO-fix | yes       | whole groups per micro-batch; grpo aggregation                               |
| CTPO                          | yes       | per-sequence prefix ratios; dapo aggregation                                 |
| OTB                           | yes       | per-group baselines (whole groups), per-row energy; dapo aggregation         |
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import batches
from tests.helpers import (
    _forward,
    assert_registered,
    compute_loss_and_grads,
    method_trainer,
    tiny_model,
    tiny_tokenizer,
)
from tests.selection import tested_methods
from trl_groupopt import get_method

ATOL, RTOL = 1e-6, 1e-5
DFPO_EPS = dict(epsilon=0.05, epsilon_high=0.08)  # some sequences clipped, some not, on the "mixed" log-ratios

#: registry name -> {case id: config overrides}: configurations checked besides every method's own case (named after
#: it, under its spec's `acting_settings`). A method without an entry runs its own case only.
VARIANTS = {
    "echo": {"echo/micro_batch": dict(batch_ratio_scope="micro_batch"), "echo/global": dict(batch_ratio_scope="global")},
    "dfpo": {f"dfpo/{t}": dict(dfpo_transform=t, **DFPO_EPS) for t in ("min_replace", "orth_proj", "orth_proj_qp", "none")},
}  # fmt: skip


def cases_of(method: str) -> dict[str, dict]:
    """The method's own case (its name: `acting_settings`), then its `VARIANTS`."""
    return {method: dict(get_method(method).acting_settings), **VARIANTS.get(method, {})}


CASES = {name: overrides for method in tested_methods() for name, overrides in cases_of(method).items()}
METHOD_OF = {name: name.split("/")[0] for name in CASES}  # case names start with the registry name
#: Methods whose loss is NOT accumulation invariant, with the reason in the module docstring; all others must be.
NOT_INVARIANT = {"echo"}
INVARIANT_CASES = [name for name in CASES if METHOD_OF[name] not in NOT_INVARIANT]


def test_tables_name_registered_methods():
    assert_registered(VARIANTS, "VARIANTS")
    assert_registered(NOT_INVARIANT, "NOT_INVARIANT")


class Trainers:
    """One trainer per case (and the baseline's own case for the loss-type tests), built on first use."""

    def __init__(self, root):
        self.root, self.tokenizer, self.built = root, tiny_tokenizer(), {}

    def __getitem__(self, name: str):
        if name not in self.built:
            method = name.split("/")[0]
            trainer = method_trainer(method, self.root / name.replace("/", "_"),
                                     tiny_model(self.tokenizer, seed=2), self.tokenizer,
                                     per_device_train_batch_size=batches.HALF, num_generations=batches.GROUP_SIZE,
                                     max_completion_length=batches.COMPLETION_LEN,
                                     **cases_of(method)[name])  # fmt: skip
            trainer.model.train()
            self.built[name] = trainer
        return self.built[name]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    trainers = Trainers(tmp_path_factory.mktemp("accumulation"))
    return trainers.tokenizer, trainers


def assert_mechanism_acted(method: str, metrics: dict) -> None:
    """The method's mechanism (its spec's definition) acted on the batch whose `metrics` these are."""
    mechanism = get_method(method).mechanism
    means = {key: sum(values) / len(values) for key, values in metrics.items() if values}
    if mechanism is None:  # a method without a report: its clip, at least, where it has TRL's clip metrics
        assert means.get("clip_ratio/region_mean", 1.0) > 0, method  # an objective may log no metric at all
        return
    acted = mechanism.acted_on(means)
    assert acted, f"{method}: {mechanism.name} did not act ({ {k: means.get(k) for k in mechanism.keys} })"


def _inputs(trainer, tokenizer, scenario: str, equal_halves: bool = False) -> dict:
    """The whole generation batch with `old = logp_initial - log_ratio` (so log r = the scenario's log-ratios)."""
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    if equal_halves:  # second half: the first half's lengths, reversed (same token count, 49 each)
        mask = batch["completion_mask"]
        mask[batches.HALF :] = mask[: batches.HALF].flip(0)
        batch["completion_ids"] = batch["completion_ids"].masked_fill(mask == 0, tokenizer.pad_token_id)
        batch["num_items_in_batch"] = mask.sum()
    with torch.no_grad():
        logps, _, _ = _forward(trainer, trainer.model, batch)
    inputs = {
        key: batch[key]
        for key in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "advantages",
            "num_items_in_batch",
        )
    }
    inputs["old_per_token_logps"] = (logps - batches.log_ratios(scenario)).detach()
    inputs["group_ids"] = torch.arange(batches.NUM_ROWS) // batches.GROUP_SIZE
    inputs["rewards"] = batch["rewards_per_func"].squeeze(1)  # raw rewards (OTB)
    return inputs


def _half(inputs: dict, part: int) -> dict:
    rows = slice(part * batches.HALF, (part + 1) * batches.HALF)
    return {k: (v if k == "num_items_in_batch" else v[rows]) for k, v in inputs.items()}


def _big_and_accumulated(trainer, inputs):
    """(big loss, big grads, big metrics), (summed micro losses, summed micro grads, [(loss, grads, metrics)] of the
    two micro-batches)."""
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1
    big = compute_loss_and_grads(trainer, inputs)
    trainer.current_gradient_accumulation_steps = 2
    trainer.args.steps_per_generation = 2
    micro = [compute_loss_and_grads(trainer, _half(inputs, part)) for part in (0, 1)]
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1
    summed = {n: micro[0][1][n] + micro[1][1][n] for n in big[1]}
    return big, (micro[0][0] + micro[1][0], summed, micro)


def _assert_same(big, accumulated, what):
    (big_loss, big_grads, _), (acc_loss, acc_grads, _) = big, accumulated
    torch.testing.assert_close(acc_loss, big_loss, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what} loss: {m}")
    assert big_grads.keys() == acc_grads.keys() and big_grads
    assert max(g.abs().max().item() for g in big_grads.values()) > 1e-2  # a real gradient, not ~0
    for n in big_grads:
        torch.testing.assert_close(
            acc_grads[n], big_grads[n], atol=ATOL, rtol=RTOL, msg=lambda m, n=n: f"{what} {n}: {m}"
        )


def _max_grad_diff(big, accumulated) -> float:
    return max((big[1][n] - accumulated[1][n]).abs().max().item() for n in big[1])


@pytest.mark.parametrize(
    "loss_type,level",
    [("grpo", "token"), ("dr_grpo", "token"), ("dapo", "token"), ("dapo", "sequence"), ("luspo", "sequence")],
)
def test_base_loss_types_are_accumulation_invariant(setup, loss_type, level):
    tokenizer, trainers = setup
    trainer = trainers["grpo"]
    trainer.loss_type, trainer.importance_sampling_level = loss_type, level
    try:
        big, acc = _big_and_accumulated(trainer, _inputs(trainer, tokenizer, "mixed"))
    finally:
        trainer.loss_type, trainer.importance_sampling_level = "dapo", "token"
    _assert_same(big, acc, loss_type)
    assert big[2]["clip_ratio/region_mean"][0] > 0  # the clip acts


def test_bnpo_is_invariant_only_with_equal_token_counts(setup):
    """bnpo normalises each micro-batch by its own token count (TRL's semantics), then divides by GA."""
    tokenizer, trainers = setup
    trainer = trainers["grpo"]
    trainer.loss_type = "bnpo"
    try:
        inputs = _inputs(trainer, tokenizer, "mixed")
        unequal = _big_and_accumulated(trainer, inputs)
        equal = _big_and_accumulated(trainer, _inputs(trainer, tokenizer, "mixed", equal_halves=True))
    finally:
        trainer.loss_type = "dapo"
    big, acc = unequal
    counts = [_half(inputs, part)["completion_mask"].sum().item() for part in (0, 1)]
    assert counts == [49, 29]
    sums = [2 * loss.item() * count for (loss, _, _), count in zip(acc[2], counts)]  # loss_k = S_k / N_k / 2
    assert big[0].item() == pytest.approx(sum(sums) / sum(counts), abs=ATOL, rel=RTOL)  # the reason, exactly
    assert abs(acc[0].item() - big[0].item()) > 1e-3
    assert _max_grad_diff(big, acc) > 1e-3
    _assert_same(*equal, "bnpo, equal token counts")


@pytest.mark.parametrize("name", INVARIANT_CASES)
def test_methods_are_accumulation_invariant(setup, name):
    tokenizer, trainers = setup
    trainer = trainers[name]
    big, acc = _big_and_accumulated(trainer, _inputs(trainer, tokenizer, "mixed"))
    _assert_same(big, acc, name)
    if name in VARIANTS.get(METHOD_OF[name], {}):  # a variant: its clip acts
        assert big[2]["clip_ratio/region_mean"][0] > 0
    else:  # the method's own case: its mechanism acts
        assert_mechanism_acted(name, big[2])


def test_echo_is_not_accumulation_invariant(setup):
    """R is per micro-batch in both scopes ("global" reduces over processes only, so in one process it is the
    micro_batch computation). split: each half's R is clipped (e^{+-0.3} vs [0.8, 1.2]), the union's is not: the
    loss and gradient differ. unclipped: C = 1 everywhere so the summed loss equals the big one, but the gradient
    differs through Eq. 34's coupling term (L_k / N_k of each micro-batch instead of L / N)."""
    tokenizer, trainers = setup
    results = {}
    for scope in ("micro_batch", "global"):
        trainer = trainers[f"echo/{scope}"]
        for scenario in ("split", "unclipped"):
            results[scope, scenario] = _big_and_accumulated(trainer, _inputs(trainer, tokenizer, scenario))

    (big, big_grads, big_metrics), acc = results["micro_batch", "split"]
    assert big_metrics["echo/batch_clipped"] == [0.0]
    assert [metrics["echo/batch_clipped"] for _, _, metrics in acc[2]] == [[1.0], [1.0]]
    assert abs(acc[0].item() - big.item()) > 1e-3
    assert _max_grad_diff((big, big_grads), acc) > 1e-2

    (big, big_grads, big_metrics), acc = results["micro_batch", "unclipped"]
    assert big_metrics["echo/batch_clipped"] == [0.0]
    assert [metrics["echo/batch_clipped"] for _, _, metrics in acc[2]] == [[0.0], [0.0]]
    torch.testing.assert_close(acc[0], big, atol=ATOL, rtol=RTOL)
    assert _max_grad_diff((big, big_grads), acc) > 1e-4

    for scenario in ("split", "unclipped"):  # one process: the global scope is the micro_batch computation
        (big_m, grads_m, _), acc_m = results["micro_batch", scenario]
        (big_g, grads_g, _), acc_g = results["global", scenario]
        torch.testing.assert_close(big_g, big_m, atol=0, rtol=0)
        torch.testing.assert_close(acc_g[0], acc_m[0], atol=0, rtol=0)
        assert _max_grad_diff((big_m, grads_m), (big_g, grads_g)) == 0.0
        assert _max_grad_diff((None, acc_m[1]), (None, acc_g[1])) == 0.0
