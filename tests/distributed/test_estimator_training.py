"""`trl-groupopt train --method {echo,ctpo,grpo_fix} --advantage_estimator otb` trains 2 steps on the embedded policy on
1 and on 2 CPU processes (gloo), `workers/estimator_training.py`: the configs select OTB's estimator, OTB's metrics
and the objective's own are logged at every step, the parameters move and stay finite, and both ranks hold the same
parameters. (Sharding invariance of the same combinations, on a fixed batch: `test_sharding_invariance.py`.)"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.harness import case_of, launch_worlds
from tests.distributed.workers.estimator_training import CASES
from trl_groupopt import get_method
from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

OTB_METRICS = ("otb/energy_mean", "otb/baseline_mean", "otb/adv_abs_mean", "otb/grad_second_moment",
               "otb/grad_second_moment_group_mean_baseline")  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch_worlds("estimator_training.py", tmp_path_factory.mktemp("estimator_training"), timeout=900)


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_two_steps_on_otb_advantages(runs, name, world_size):
    result, tensors = case_of(runs, world_size, name)
    assert result["steps"] == 2 and len(result["logged"]) == 2
    assert result["estimator"] == result["args_estimator"] == "otb"
    headline = get_method(CASES[name][0]).headline_metric
    for entry in result["logged"]:
        for metric in (*OTB_METRICS, headline, "loss"):
            assert math.isfinite(entry[metric]), (name, metric, entry.get(metric))
    initial = load_file(f"{EMBEDDED_POLICY_PATH}/model.safetensors")
    params = tensors["params"]
    assert all(torch.isfinite(p).all() for p in params.values())
    assert any(not torch.equal(initial[n], params[n]) for n in initial if n in params), name


@pytest.mark.parametrize("name", list(CASES))
def test_ranks_hold_identical_parameters(runs, name):
    (_, rank0), (_, rank1) = case_of(runs, 2, name, 0), case_of(runs, 2, name, 1)
    assert rank0["params"].keys() == rank1["params"].keys()
    assert all(torch.equal(rank0["params"][n], rank1["params"][n]) for n in rank0["params"])
