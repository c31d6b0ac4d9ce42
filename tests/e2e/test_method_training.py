"""Every registered method, and some of its modes, trains 2 steps end to end on CPU and logs its headline metric (the
one-step parity and wiring checks are in tests/trainers/test_methods.py)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import clone_model, method_trainer, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from trl_groupopt import get_method


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=3), tmp_path_factory.mktemp("methods")


#: Modes of a registered method that the 2-step run covers besides its defaults: id -> (method, overrides, metric).
VARIANTS = {
    "echo_global": ("echo", {"batch_ratio_scope": "global"}, "echo/batch_clipped"),
    "dfpo_orth_proj": ("dfpo", {"dfpo_transform": "orth_proj"}, "dfpo/shrink"),
    "dfpo_orth_proj_qp": ("dfpo", {"dfpo_transform": "orth_proj_qp"}, "dfpo/asym_before"),
}


def _train_two_steps(tiny, method, overrides, metric):
    """2 optimizer steps, off-policy (steps_per_generation 4 > accumulation 2): parameters move, metrics logged."""
    tokenizer, model, tmp = tiny
    run = "-".join([method, *map(str, overrides.values())])
    trainer = method_trainer(method, tmp / f"e2e-{run}", clone_model(model), tokenizer, num_examples=32,
                             steps_per_generation=4, gradient_accumulation_steps=2, **overrides)  # fmt: skip
    assert isinstance(trainer, get_method(method).trainer_class)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2
    assert all(metric in entry and entry[metric] is not None for entry in logged), logged[-1].keys()
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logged)


@pytest.mark.parametrize("method", tested_methods())
def test_two_step_training(tiny, method):
    """Every registered method trains 2 steps with its defaults and logs its headline metric."""
    _train_two_steps(tiny, method, {}, get_method(method).headline_metric)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_step_training_variants(tiny, variant):
    _train_two_steps(tiny, *VARIANTS[variant])
