"""The jobs of `trl-groupopt compare` without processes: Slurm jobs pending for a reason that will not clear are said
with the fix, and the starting model is scored once per folder and model (its jobs share it). With processes:
tests/e2e/test_compare_jobs.py."""

from __future__ import annotations

import json

from trl_groupopt.comparison import slurm_pending, trainrun
from trl_groupopt.comparison.slurm import SlurmOptions

NODES = {"cpus": 2, "mem": 3900, "gpus": 0}


def test_a_request_larger_than_any_node_is_said_with_the_option_to_lower():
    said = slurm_pending.problem("Resources", SlurmOptions(time="10", cpus_per_run=999, gpus_per_run=0), NODES)
    assert said == "squeue reason Resources: each job asks --slurm_cpus_per_run 999 CPUs, its partition's nodes have " \
        "at most 2: lower it"  # fmt: skip
    said = slurm_pending.problem("(Resources)", SlurmOptions(time="10", mem="64G", gpus_per_run=0), NODES)
    assert said is not None and "--slurm_mem 65536 MB of memory" in said and "at most 3900" in said


def test_reasons_that_clear_are_not_said_and_those_that_do_not_are():
    fits = SlurmOptions(time="10", cpus_per_run=1, gpus_per_run=0)
    for reason in ("Priority", "Resources", "Dependency", "QOSMaxJobsPerUserLimit", "None"):
        assert slurm_pending.problem(reason, fits, NODES) is None, reason
    said = slurm_pending.problem("PartitionTimeLimit", SlurmOptions(time="9000", partition="debug"), NODES)
    assert said == "squeue reason PartitionTimeLimit: --slurm_time is longer than partition debug allows: fix the " \
        "--slurm_* options"  # fmt: skip
    assert "not available" in slurm_pending.problem("ReqNodeNotAvail, UnavailableNodes:n1", fits, NODES)


def test_the_starting_model_is_scored_once_per_heldout_file_and_model(tmp_path, monkeypatch):
    scored = []
    monkeypatch.setattr(trainrun, "score", lambda spec, model, device: scored.append(model) or 0.25)
    (tmp_path / "data").mkdir()
    heldout = tmp_path / "data" / "heldout.jsonl"
    heldout.write_text('{"prompt": "Compute 1+1", "solution": "2"}\n')
    spec = trainrun.RunSpec(str(tmp_path), ("--model_name_or_path", "m1"), True, 1)
    assert trainrun.base_accuracy(spec, "cpu") == trainrun.base_accuracy(spec, "cpu") == 0.25
    assert scored == ["m1"]
    heldout.write_text('{"prompt": "Compute 1+2", "solution": "3"}\n')  # carved again: another held-out file
    trainrun.base_accuracy(spec, "cpu")
    trainrun.base_accuracy(trainrun.RunSpec(str(tmp_path), ("--model_name_or_path", "m2"), True, 1), "cpu")
    assert scored == ["m1", "m1", "m2"]
    kept = json.loads((tmp_path / "data" / trainrun.BASE_ACCURACY).read_text())
    assert kept["accuracy"] == 0.25 and kept["measured_on"]["model"] == "m2"


def test_a_hub_dataset_compare_cannot_reach_is_one_line(tmp_path, capsys):
    """Issue 52: offline, a Hub dataset gave a 34-line traceback in compare (train: one line)."""
    from trl_groupopt.comparison import driver

    argv = ["--methods", "grpo,otb", "--seeds", "2", "--output_dir", str(tmp_path / "cmp"), "--dataset_name",
            "no-such-owner/no-such-dataset"]  # fmt: skip
    assert driver.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "--dataset_name no-such-owner/no-such-dataset cannot be loaded (" in err and "offline" in err, err
    assert not (tmp_path / "cmp" / "runs").exists()  # nothing ran
