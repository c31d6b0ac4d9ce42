"""The forward's noise metric in a real run (`trl_groupopt/trainer/numerics.py`): CTPO on the embedded policy, fp32,
2 optimizer steps per rollout and 2 micro-batches per step. TRL's behaviour forward and the loss forward score the
same rows at the same width, so in fp32 on CPU the log-ratio of each rollout's first step is exactly 0; it is logged
on those steps only (the second step's ratios carry the real update)."""

from __future__ import annotations

from tests.helpers import cpu_config_kwargs, tiny_dataset
from trl_groupopt import CTPOConfig, CTPOTrainer
from trl_groupopt.data.offline import load_embedded_policy

RMS_METRIC, SHARE_METRIC = "numerics/log_ratio_rms", "numerics/noise_share/"  # the logged names (docs/ctpo.md)


def _spread_reward(completions, **kwargs) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, text)) % 5) for text in texts]


def test_first_step_noise_is_exactly_zero_in_fp32_and_logged_only_there(tmp_path):
    model, tokenizer = load_embedded_policy()
    args = CTPOConfig(**cpu_config_kwargs(tmp_path, max_steps=4, steps_per_generation=4, gradient_accumulation_steps=2,
                                          max_completion_length=16))  # fmt: skip
    trainer = CTPOTrainer(model, _spread_reward, args=args, train_dataset=tiny_dataset(32), processing_class=tokenizer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3, 4]
    measured = [entry["step"] for entry in logged if RMS_METRIC in entry]
    assert measured == [1, 3], measured  # each rollout's first optimizer step
    for entry in logged:
        if entry["step"] in measured:
            assert entry[RMS_METRIC] == 0.0 and entry[SHARE_METRIC + "prefix_clip"] == 0.0, entry
        else:
            assert entry["ctpo/abs_cum_log_ratio/t<=16"] > 0  # the policy moved: the ratios are not noise
