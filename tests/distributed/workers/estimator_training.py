"""Worker: `trl-groupopt train` for 2 optimizer steps on the embedded policy with OTB's advantages under ECHO's, CTPO's
and GRPO-fix's objectives (`advantage_estimator="otb"`), through the CLI's `train` (the demo's off-policy schedule).

Writes `rank{R}.json` ({"world_size", "cases": {name: {"steps", "logged": [...loss entries...]}}}) and
`rank{R}_tensors.pt` ({name: {"params"}}: the trained parameters).
"""

import argparse
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from tests.distributed.harness import write_result  # noqa: E402
from trl_groupopt.cli.main import train  # noqa: E402

#: case name -> (registry method, extra CLI arguments)
CASES = {
    "echo+otb": ("echo", []),
    "ctpo+otb": ("ctpo", []),
    "grpo_fix+otb": ("grpo_fix", []),
}
ARGV = ["--advantage_estimator", "otb", "--max_steps", "2", "--logging_steps", "1", "--evaluate_accuracy", "false",
        "--num_train_examples", "64", "--report_to", "none", "--save_strategy", "no"]  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    cli = parser.parse_args()
    results, tensors = {}, {}
    for name, (method, extra) in CASES.items():
        trainer = train(method, [*ARGV, *extra, "--output_dir", os.path.join(cli.out, "run", name)])
        assert trainer.accelerator.num_processes == cli.world_size
        logged = [entry for entry in trainer.state.log_history if "loss" in entry]
        results[name] = {"steps": trainer.state.global_step, "logged": logged, "estimator": trainer.estimator.name,
                         "args_estimator": trainer.args.advantage_estimator}  # fmt: skip
        tensors[name] = {"params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()}}
    rank = int(os.environ.get("RANK", "0"))
    torch.save(tensors, os.path.join(cli.out, f"rank{rank}_tensors.pt"))
    write_result(cli.out, {"world_size": cli.world_size, "cases": results})


if __name__ == "__main__":
    main()
