"""FSDP2 on 2 CPU processes (gloo): one optimizer step equals one plain process over the union of the data.

`workers/fsdp2_step.py` (the machinery of `workers/one_step.py`: fixed generation batch, fixed off-policy log-ratios,
SGD) runs the base trainer and every method, plus OTB with LoRA, once on 1 process without sharding and once on 2
processes under accelerate's FSDP2 plugin (forced onto CPU: accelerate 1.15 silently downgrades FSDP to DDP when
`use_cpu=True`, see the worker's docstring). One launch per world size for all cases, both launches concurrent.

Compared per case, at the tolerance of `test_sharding_invariance.py` (`atol=1e-6, rtol=1e-5`): the logged loss and
`grad_norm`, the full (un-sharded) gradient entering the optimizer, the updated parameters, and OTB's logged energy
and baseline (the energy is captured from TRL's fused LM head inside FSDP2's all-gathered forward).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.harness import case_of, launch_worlds
from trl_groupopt import METHODS

ATOL, RTOL = 1e-6, 1e-5  # as test_sharding_invariance.py
LEARNING_RATE = 0.5  # workers/one_step.py
#: registry name -> the cases of workers/one_step.py run under FSDP2 (a sharding-invariant configuration of the method);
#: a method not named here runs its default case, named after it.
FSDP_CASES = {"grpo": ["grpo/grpo", "grpo"], "echo": ["echo/global/split"], "dfpo": ["dfpo/min_replace"]}
CASES = [case for method in METHODS for case in FSDP_CASES.get(method, [method])] + ["lora/otb"]
OTB_METRICS = ("otb/energy_mean", "otb/baseline_mean", "otb/adv_abs_mean", "otb/grad_second_moment",
               "otb/grad_second_moment_group_mean_baseline")  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world_size: (per-rank JSON results, per-rank tensors)}; world 1 plain, world 2 FSDP2."""
    return launch_worlds("fsdp2_step.py", tmp_path_factory.mktemp("fsdp2"), "--cases", ",".join(CASES))


def test_two_processes_are_sharded_by_fsdp2(runs):
    """The 2-process run really is FSDP2: DTensor parameters sharded on dim 0, each rank holding about half."""
    for name in CASES:
        for rank in range(2):
            sharding = case_of(runs, 2, name, rank)[0]["sharding"]
            assert sharding["distributed_type"] == "DistributedType.FSDP", (name, sharding)
            assert sharding["model_class"].startswith("FSDP"), (name, sharding)
            assert sharding["dtensor_params"] == sharding["trainable_params"] > 0, (name, sharding)
            assert sharding["sharded_dim0"], (name, sharding)
            assert sharding["local_numel"] < 0.6 * sharding["full_numel"], (name, sharding)
        one = case_of(runs, 1, name)[0]["sharding"]
        assert one["dtensor_params"] == 0 and one["distributed_type"] != "DistributedType.FSDP", (name, one)
    assert case_of(runs, 2, "lora/otb")[0]["sharding"]["model_class"] == "FSDPPeftModelForCausalLM"


@pytest.mark.parametrize("name", CASES)
def test_fsdp2_step_equals_one_process(runs, name):
    (one, one_tensors), (two, two_tensors) = case_of(runs, 1, name), case_of(runs, 2, name)
    assert two["logged"]["loss"] == pytest.approx(one["logged"]["loss"], abs=ATOL, rel=RTOL)
    assert two["logged"]["grad_norm"] == pytest.approx(one["logged"]["grad_norm"], abs=ATOL, rel=RTOL)
    for what in ("grads", "params"):
        assert one_tensors[what].keys() == two_tensors[what].keys() and one_tensors[what]
        for n in one_tensors[what]:
            torch.testing.assert_close(two_tensors[what][n], one_tensors[what][n], atol=ATOL, rtol=RTOL,
                                       msg=lambda m, n=n, what=what: f"{name} {what} {n}: {m}")  # fmt: skip
    # a real SGD step with a non-trivial gradient, on both ranks the same full parameters
    grads, params, initial = one_tensors["grads"], one_tensors["params"], one_tensors["initial"]
    assert max(g.abs().max().item() for g in grads.values()) > 1e-2, name
    for n in params:
        torch.testing.assert_close(params[n], initial[n] - LEARNING_RATE * grads[n], atol=1e-7, rtol=0)
    other = case_of(runs, 2, name, rank=1)[1]
    for n in two_tensors["params"]:
        assert torch.equal(other["params"][n], two_tensors["params"][n]), (name, n)


@pytest.mark.parametrize("name", ["otb", "lora/otb"])
def test_otb_energy_under_fsdp2_equals_one_process(runs, name):
    """OTB's energy comes from TRL's fused LM head, run inside FSDP2's all-gathered forward (with LoRA: of the PEFT
    base model). The per-token energy of the behaviour forward and the OTB advantages built from it (rows of both
    ranks, in global group order) equal the 1-process run's."""
    one = case_of(runs, 1, name)[1]["otb"]
    two = [case_of(runs, 2, name, rank)[1]["otb"] for rank in range(2)]
    assert torch.equal(torch.cat([t["group_ids"] for t in two]), one["group_ids"])
    keys = ["advantages"] + (["energy"] if "energy" in one else [])
    for key in keys:
        union = torch.cat([t[key] for t in two])
        assert union.abs().max() > 0, key
        torch.testing.assert_close(union, one[key], atol=ATOL, rtol=RTOL, msg=lambda m, key=key: f"{name} {key}: {m}")
    # the advantages are not the group-mean baseline's (constant per row): the token baseline varies along t
    mask = one["advantages"] != 0
    assert (one["advantages"].max(dim=1).values - one["advantages"].min(dim=1).values)[mask.any(dim=1)].max() > 1e-4


@pytest.mark.parametrize("name", ["otb", "lora/otb"])
def test_otb_logged_metrics_are_token_weighted_over_processes(runs, name):
    """OTB's logged means are over every process's tokens: the 2-process run logs the 1-process run's values (a mean
    of per-process means would not: the two ranks hold different numbers of completion tokens)."""
    one = case_of(runs, 1, name)[0]["logged"]
    for rank in range(2):
        two = case_of(runs, 2, name, rank)[0]["logged"]
        for key in OTB_METRICS:
            assert abs(one[key]) > 0, key
            assert two[key] == pytest.approx(one[key], abs=ATOL, rel=RTOL), (name, rank, key)
