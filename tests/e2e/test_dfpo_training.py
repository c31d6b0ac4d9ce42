"""DFPOTrainer end to end: a 2-step run on the embedded policy logs the cancellation residual and the clip metrics,
and the residual is exact cancellation. arXiv:2604.13088; docs/dfpo.md."""

from __future__ import annotations

from tests.helpers import cpu_config_kwargs, tiny_dataset
from trl_groupopt import DFPOConfig, DFPOTrainer
from trl_groupopt.data.offline import load_embedded_policy


def _spread_reward(completions, **kwargs) -> list[float]:
    """A deterministic reward that differs between completions of one prompt (a checksum of the text)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, text)) % 5) for text in texts]


def test_residual_and_clip_metrics_logged_on_the_embedded_policy(tmp_path):
    model, tokenizer = load_embedded_policy()
    args = DFPOConfig(**cpu_config_kwargs(tmp_path, steps_per_generation=4, gradient_accumulation_steps=2,
                                          dfpo_transform="orth_proj", dfpo_orthogonal_over="unclipped"))  # fmt: skip
    trainer = DFPOTrainer(model, _spread_reward, args=args, train_dataset=tiny_dataset(32), processing_class=tokenizer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:
        for key in (
            "dfpo/cancellation_residual",
            "clip_ratio/low_min",
            "clip_ratio/high_max",
            "clip_ratio/region_mean",
        ):
            assert key in entry, sorted(entry)
    # NaN (logged as None) on a step where no group had two moving completions (the sampled rewards decide, so it
    # depends on the RNG state); exact cancellation, up to float32 rounding, on every step that measured one
    residuals = [entry["dfpo/cancellation_residual"] for entry in logged]
    assert all(r is None or r != r or 0 <= r < 1e-5 for r in residuals), residuals
