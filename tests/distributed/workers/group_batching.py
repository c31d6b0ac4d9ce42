"""Worker: train a whole-group trainer for 2 optimizer steps and record every micro-batch's groups."""

import argparse
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from trl import GRPOConfig

from tests.distributed.harness import write_result
from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from trl_groupopt.trainer.base import GroupOptTrainer


class RecordingGroupTrainer(GroupOptTrainer):
    requires_whole_groups = True

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.record["generations"].append(output["group_ids"].tolist())
        return output

    def _compute_loss(self, model, inputs):
        self.record["micro_batches"].append(
            {"group_ids": inputs["group_ids"].tolist(), "prompt_ids": inputs["prompt_ids"].tolist()}
        )
        return super()._compute_loss(model, inputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    cli = parser.parse_args()
    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        **cpu_config_kwargs(
            os.path.join(cli.out, "run"),
            per_device_train_batch_size=4,
            num_generations=2,
            steps_per_generation=4,
            gradient_accumulation_steps=2,
            max_steps=2,
            max_completion_length=4,
        )
    )
    trainer = RecordingGroupTrainer(
        tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(32), processing_class=tokenizer
    )
    assert trainer.accelerator.num_processes == cli.world_size, trainer.accelerator.num_processes
    trainer.record = {"generations": [], "micro_batches": []}
    trainer.train()
    write_result(cli.out, {"world_size": trainer.accelerator.num_processes, **trainer.record})


if __name__ == "__main__":
    main()
