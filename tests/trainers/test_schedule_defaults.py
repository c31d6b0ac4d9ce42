"""The default off-policy schedules of ECHOConfig / CTPOConfig, CTPO's vLLM IS defaults, and the on-policy warning."""

from __future__ import annotations

import warnings

import pytest

from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset, tiny_model, tiny_tokenizer
from trl_groupopt import (
    CTPOConfig,
    CTPOTrainer,
    DFPOConfig,
    DFPOTrainer,
    ECHOConfig,
    ECHOTrainer,
    OTBConfig,
    OTBTrainer,
)


def _config(config_cls, tmp_path, **overrides):
    kwargs = cpu_config_kwargs(tmp_path, **overrides)
    return config_cls(**kwargs)


@pytest.mark.parametrize("config_cls,updates", [(ECHOConfig, 8), (CTPOConfig, 16)])
@pytest.mark.parametrize("accumulation", [1, 3])
def test_default_schedule_is_off_policy(tmp_path, config_cls, updates, accumulation):
    args = _config(config_cls, tmp_path, gradient_accumulation_steps=accumulation)
    assert args.steps_per_generation == updates * accumulation
    assert args.num_iterations == 1
    assert args.generation_batch_size == args.per_device_train_batch_size * updates * accumulation
    assert args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) != 0  # off-policy


@pytest.mark.parametrize("config_cls", [ECHOConfig, CTPOConfig])
def test_a_user_schedule_is_kept(tmp_path, config_cls):
    args = _config(config_cls, tmp_path, steps_per_generation=1)
    assert (args.steps_per_generation, args.num_iterations) == (1, 1)
    args = _config(config_cls, tmp_path, num_iterations=2)  # TRL's steps_per_generation default then
    assert (args.steps_per_generation, args.num_iterations) == (args.gradient_accumulation_steps, 2)
    args = _config(config_cls, tmp_path, num_iterations=1)  # explicitly set: TRL's on-policy schedule
    assert args.steps_per_generation == args.gradient_accumulation_steps
    args = _config(config_cls, tmp_path, generation_batch_size=8)
    assert (args.steps_per_generation, args.num_iterations) == (2, 1)


def test_ctpo_vllm_importance_sampling_defaults_are_the_authors(tmp_path):
    args = _config(CTPOConfig, tmp_path)
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == ("sequence_truncate", 5.0)
    args = _config(
        CTPOConfig, tmp_path, vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=2.0
    )
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == ("token_mask", 2.0)
    args = _config(CTPOConfig, tmp_path, vllm_importance_sampling_clip_max=None, vllm_importance_sampling_clip_min=0.5)
    assert (args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max) == (0.5, None)


def test_ctpo_position_power_defaults_per_ratio_mode(tmp_path):
    assert _config(CTPOConfig, tmp_path).ctpo_position_power == 0.5
    assert _config(CTPOConfig, tmp_path, ctpo_ratio_mode="geomean").ctpo_position_power == -0.5
    assert _config(CTPOConfig, tmp_path, ctpo_ratio_mode="geomean", ctpo_position_power=-1.0).ctpo_position_power == -1


def test_echo_default_scope_is_step_and_falls_back_with_a_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert _config(ECHOConfig, tmp_path).batch_ratio_scope == "step"
    with pytest.warns(UserWarning, match="defaults to 'global', not the paper's 'step'.*not a multiple"):
        args = _config(ECHOConfig, tmp_path, steps_per_generation=1, gradient_accumulation_steps=2)
    assert args.batch_ratio_scope == "global"
    with pytest.warns(UserWarning, match="defaults to 'micro_batch'.*loss_type='grpo'"):
        assert _config(ECHOConfig, tmp_path, loss_type="grpo").batch_ratio_scope == "micro_batch"


@pytest.mark.parametrize(
    "overrides",
    [
        *({"use_vllm": True, "vllm_importance_sampling_mode": mode}
          for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")),
        {"top_entropy_quantile": 0.2},
        {"off_policy_mask_threshold": 0.5},
        {"use_vllm": True, "top_entropy_quantile": 0.2, "off_policy_mask_threshold": 0.5},
    ],
    ids=lambda overrides: ",".join(f"{k}={v}" for k, v in overrides.items()),
)  # fmt: skip
def test_echo_keeps_the_step_scope_with_loss_multipliers(tmp_path, overrides):
    """vLLM's IS correction (on by default with use_vllm), the entropy and off-policy masks: "step" stays the
    default, without a warning (the scope is exact with them, tests/trainers/test_echo_step_scope.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        args = _config(ECHOConfig, tmp_path, **overrides)
    assert args.batch_ratio_scope == "step"
    assert not args.use_vllm or args.vllm_importance_sampling_correction  # TRL's default: the correction is on
    # a loss type with per-sequence normalisers still falls back, naming it (and only it)
    with pytest.warns(UserWarning, match=r"defaults to 'micro_batch', not the paper's 'step', because of "
                      r"loss_type='grpo' \(use one of \('dapo', 'dr_grpo'\)\)\. Set"):  # fmt: skip
        assert _config(ECHOConfig, tmp_path, loss_type="grpo", **overrides).batch_ratio_scope == "micro_batch"


ON_POLICY_CASES = {
    "echo": (ECHOTrainer, ECHOConfig, {}, "ECHO's batch clip never acts"),
    "ctpo": (CTPOTrainer, CTPOConfig, {}, "CTPO is exactly token-level GRPO"),
    "dfpo": (DFPOTrainer, DFPOConfig, {}, "DFPO's re-weighting"),
    "grpo_fix": (DFPOTrainer, DFPOConfig, {"dfpo_transform": "symmetric_clip"}, "GRPO-fix's clip"),
}


def _build(trainer_cls, config_cls, tmp_path, **overrides):
    tokenizer = tiny_tokenizer()
    args = config_cls(**cpu_config_kwargs(tmp_path, num_generations=2, **overrides))
    return trainer_cls(
        tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(8), processing_class=tokenizer
    )


def _inert_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "this schedule is on-policy" in str(w.message)]


@pytest.mark.parametrize("name", list(ON_POLICY_CASES))
def test_on_policy_schedule_warns_once_naming_the_fix(tmp_path, name):
    trainer_cls, config_cls, overrides, mechanism = ON_POLICY_CASES[name]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _build(trainer_cls, config_cls, tmp_path / "on", steps_per_generation=1, **overrides)
    messages = _inert_warnings(record)
    assert len(messages) == 1, messages
    assert mechanism in messages[0] and "steps_per_generation" in messages[0]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _build(trainer_cls, config_cls, tmp_path / "off", steps_per_generation=2, **overrides)
    assert _inert_warnings(record) == []


def test_otb_does_not_warn_on_policy(tmp_path):
    """OTB's baseline changes the advantages: it acts on-policy too."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _build(OTBTrainer, OTBConfig, tmp_path, steps_per_generation=1)
    assert _inert_warnings(record) == []
