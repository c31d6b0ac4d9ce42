"""The README's first snippet shows no warning of the stack that no user can act on (issue 51, new user 9: three
`gradient_checkpointing` FutureWarnings and a `pin_memory` warning)."""

from __future__ import annotations

import warnings

from trl_groupopt import ECHOConfig, ECHOTrainer
from trl_groupopt.offline import EMBEDDED_POLICY_PATH, make_arithmetic_dataset
from trl_groupopt.rewards import accuracy_reward


def test_the_readme_snippet_shows_no_stack_warnings(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = ECHOTrainer(
            model=EMBEDDED_POLICY_PATH, reward_funcs=accuracy_reward, train_dataset=make_arithmetic_dataset(200),
            args=ECHOConfig(output_dir=str(tmp_path / "tiny-ECHO"), max_steps=2, per_device_train_batch_size=8,
                            num_generations=4, max_completion_length=48, use_cpu=True),
        )  # fmt: skip
        trainer.train()
    said = [f"{w.category.__name__}: {w.message}" for w in caught]
    assert [s for s in said if "checkpointing" in s or "pin_memory" in s] == [], said
