"""Every invalid configuration raises a `ValueError` whose message names the fix, at a stated point:

* "config": the config's `__post_init__` (ours, or TRL's `GRPOConfig`), i.e. when the config object is built,
  including `TrlParser` / `--config` YAML parsing in the example scripts;
* "trainer": `GroupOptTrainer.__init__`, which calls `validate_args` and the Liger/Unsloth routing check *before*
  `GRPOTrainer.__init__`, so no model is loaded (these tests pass `model=None` to prove it);
* "first loss": the objective's own argument check, at the first `_compute_loss` (after the first generation).

tests/trainers/test_guards.py covers the helper-level guards on the base class (TRL loss types on GroupOptTrainer,
the whole-group and num_generations checks and delta on a stand-in class, Unsloth/Liger detection on synthetic
classes); this file covers the real method configs and trainers. Gaps found are xfail(strict=True) tests.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs, length_reward, random_batch, tiny_dataset, tiny_model, tiny_tokenizer
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
from trl_groupopt.trainers.base import GroupOptTrainer, check_loss_routed_through_compute_loss

METHODS = {  # name -> (trainer, config, overrides selecting the mode)
    "echo": (ECHOTrainer, ECHOConfig, {}),
    "dfpo": (DFPOTrainer, DFPOConfig, {}),
    "grpo_fix": (DFPOTrainer, DFPOConfig, {"dfpo_transform": "symmetric_clip"}),
    "ctpo": (CTPOTrainer, CTPOConfig, {}),
    "otb": (OTBTrainer, OTBConfig, {}),
}


def _config(config_cls, tmp_path, **kwargs):
    return config_cls(**cpu_config_kwargs(tmp_path, **kwargs))


def _raises_at_construction(trainer_cls, args, match):
    """`trainer_cls.validate_args(args)` raises, and so does the constructor, before any model is touched."""
    with pytest.raises(ValueError, match=match):
        trainer_cls.validate_args(args)
    with pytest.raises(ValueError, match=match):
        trainer_cls(None, None, args=args)


# ================================================================================================ raised by the config
CONFIG_CASES = [
    # ECHO: positive clip widths, batch lower bound 1 - batch_epsilon > 0
    ("echo_epsilon_zero", ECHOConfig, {"epsilon": 0.0}, r"epsilon must be > 0, got 0"),
    ("echo_epsilon_negative", ECHOConfig, {"epsilon": -0.1}, r"epsilon must be > 0, got -0.1"),
    ("echo_epsilon_high_zero", ECHOConfig, {"epsilon_high": 0.0}, r"epsilon_high must be > 0"),
    ("echo_batch_epsilon_zero", ECHOConfig, {"batch_epsilon": 0.0}, r"batch_epsilon must be > 0"),
    ("echo_batch_epsilon_negative", ECHOConfig, {"batch_epsilon": -0.2}, r"batch_epsilon must be > 0"),
    ("echo_batch_epsilon_high_zero", ECHOConfig, {"batch_epsilon_high": 0.0}, r"batch_epsilon_high must be > 0"),
    ("echo_batch_epsilon_one", ECHOConfig, {"batch_epsilon": 1.0}, r"batch_epsilon must be < 1 \(the lower batch bound"),
    ("echo_batch_epsilon_above_one", ECHOConfig, {"batch_epsilon": 1.5}, r"batch_epsilon must be < 1"),
    # batch_epsilon defaults to epsilon, so a token epsilon >= 1 trips the batch bound (message names batch_epsilon)
    ("echo_epsilon_above_one_default_batch", ECHOConfig, {"epsilon": 1.5}, r"batch_epsilon must be < 1"),
    ("echo_unknown_scope", ECHOConfig, {"batch_ratio_scope": "batch"},
     r"batch_ratio_scope must be one of \('step', 'global', 'micro_batch'\)"),
    ("echo_step_loss_grpo", ECHOConfig, {"batch_ratio_scope": "step", "loss_type": "grpo"}, r"loss_type='grpo'"),
    ("echo_step_straddles_generations", ECHOConfig,
     {"batch_ratio_scope": "step", "steps_per_generation": 1, "gradient_accumulation_steps": 2},
     r"steps_per_generation \* num_iterations = 1 not a multiple of gradient_accumulation_steps = 2"),
    ("echo_global_loss_grpo", ECHOConfig, {"batch_ratio_scope": "global", "loss_type": "grpo"},
     r"incompatible: loss_type='grpo' \(use one of \('dapo', 'dr_grpo'\)\)\. Use batch_ratio_scope='micro_batch'"),
    ("echo_global_loss_bnpo", ECHOConfig, {"batch_ratio_scope": "global", "loss_type": "bnpo"}, r"loss_type='bnpo'"),
    ("echo_global_loss_luspo", ECHOConfig, {"batch_ratio_scope": "global", "loss_type": "luspo"},
     r"loss_type='luspo'"),
    ("echo_global_entropy_mask", ECHOConfig, {"batch_ratio_scope": "global", "top_entropy_quantile": 0.5},
     r"incompatible: top_entropy_quantile < 1\. Use batch_ratio_scope='micro_batch'"),
    ("echo_global_off_policy_mask", ECHOConfig, {"batch_ratio_scope": "global", "off_policy_mask_threshold": 0.5},
     r"incompatible: off_policy_mask_threshold\. Use"),
    ("echo_global_vllm_is", ECHOConfig, {"batch_ratio_scope": "global", "use_vllm": True},
     r"incompatible: vllm_importance_sampling_correction=True\. Use"),
    ("echo_global_all_at_once", ECHOConfig,
     {"batch_ratio_scope": "global", "loss_type": "grpo", "top_entropy_quantile": 0.5, "off_policy_mask_threshold": 1.0},
     r"loss_type='grpo' .*, top_entropy_quantile < 1, off_policy_mask_threshold\. Use"),
    # CTPO: log-space bounds, position power, token-level ratios
    ("ctpo_epsilon_zero", CTPOConfig, {"epsilon": 0.0}, r"epsilon must be > 0 for CTPO \(a log-space bound\)"),
    ("ctpo_epsilon_negative", CTPOConfig, {"epsilon": -0.025}, r"epsilon must be > 0 for CTPO"),
    ("ctpo_epsilon_high_zero", CTPOConfig, {"epsilon_high": 0.0}, r"epsilon_high must be > 0 for CTPO"),
    ("ctpo_epsilon_high_negative", CTPOConfig, {"epsilon_high": -0.05}, r"epsilon_high must be > 0 for CTPO"),
    ("ctpo_dual_clip_zero", CTPOConfig, {"ctpo_dual_clip": 0.0}, r"ctpo_dual_clip must be > 0 for CTPO"),
    ("ctpo_dual_clip_negative", CTPOConfig, {"ctpo_dual_clip": -1.0}, r"ctpo_dual_clip must be > 0 for CTPO"),
    ("ctpo_position_power_negative", CTPOConfig, {"ctpo_position_power": -0.5},
     r"ctpo_position_power must be >= 0 with ctpo_ratio_mode='cumprod' .*got -0\.5\. Negative powers"),
    ("ctpo_unknown_ratio_mode", CTPOConfig, {"ctpo_ratio_mode": "mean"}, r"ctpo_ratio_mode must be one of"),
    ("ctpo_sequence_level", CTPOConfig, {"importance_sampling_level": "sequence"},
     r"set importance_sampling_level='token' \(got 'sequence'\)"),
    # DFPO / GRPO-fix
    ("dfpo_epsilon_zero", DFPOConfig, {"epsilon": 0.0}, r"epsilon must be > 0"),
    ("dfpo_epsilon_high_negative", DFPOConfig, {"epsilon_high": -4e-4}, r"epsilon_high must be > 0"),
    ("dfpo_orth_floor_zero", DFPOConfig, {"dfpo_transform": "orth_proj", "dfpo_orth_floor": 0.0},
     r"dfpo_orth_floor must be > 0"),
    ("grpo_fix_epsilon_high_zero", DFPOConfig, {"dfpo_transform": "symmetric_clip", "epsilon_high": 0.0},
     r"epsilon_high must be > 0"),
    ("dfpo_unknown_transform", DFPOConfig, {"dfpo_transform": "min-replace"},
     r"dfpo_transform must be one of \('none', 'min_replace', 'orth_proj', 'orth_proj_qp', 'symmetric_clip'\), "
     r"got 'min-replace'"),
    ("dfpo_token_level", DFPOConfig, {"importance_sampling_level": "token"},
     r"dfpo_transform='min_replace' uses sequence-level ratios: leave importance_sampling_level unset or set it to "
     r"'sequence' \(got 'token'\)"),
    ("grpo_fix_sequence_level", DFPOConfig, {"dfpo_transform": "symmetric_clip", "importance_sampling_level": "sequence"},
     r"uses token-level ratios: leave importance_sampling_level unset or set it to 'token'"),
    # group methods: at least two generations (TRL's own GRPOConfig check fires first)
    ("dfpo_one_generation", DFPOConfig, {"num_generations": 1}, r"at least 2 generations per prompt"),
    ("otb_one_generation", OTBConfig, {"num_generations": 1}, r"at least 2 generations per prompt"),
]


@pytest.mark.parametrize("name,config_cls,kwargs,match", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_invalid_config_raises_at_construction(tmp_path, name, config_cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _config(config_cls, tmp_path, **kwargs)


def test_valid_neighbours_of_the_invalid_configs_construct(tmp_path):
    """The bounds are where the messages say (so the cases above test the bound, not a typo)."""
    echo = _config(ECHOConfig, tmp_path, epsilon=1.5, batch_epsilon=0.99, batch_epsilon_high=5.0)
    assert (echo.batch_epsilon, echo.batch_epsilon_high) == (0.99, 5.0)
    assert _config(ECHOConfig, tmp_path, batch_ratio_scope="global", loss_type="dr_grpo").loss_type == "dr_grpo"
    _config(ECHOConfig, tmp_path, batch_ratio_scope="global", use_vllm=True, vllm_importance_sampling_correction=False)
    assert _config(CTPOConfig, tmp_path, ctpo_position_power=0.0, epsilon_high=None).epsilon_high == 0.025
    assert _config(DFPOConfig, tmp_path, importance_sampling_level="sequence").importance_sampling_level == "sequence"
    grpo_fix = _config(DFPOConfig, tmp_path, dfpo_transform="symmetric_clip")
    assert (grpo_fix.importance_sampling_level, grpo_fix.epsilon_high) == ("token", 0.2)
    for transform in ("none", "min_replace", "orth_proj", "orth_proj_qp"):
        assert _config(DFPOConfig, tmp_path, dfpo_transform=transform).importance_sampling_level == "sequence"


# ================================================================================================ raised by the trainer
WHOLE_GROUP = [("dfpo_" + t, DFPOTrainer, DFPOConfig, {"dfpo_transform": t})
               for t in ("min_replace", "orth_proj", "orth_proj_qp", "none")] + [("otb", OTBTrainer, OTBConfig, {})]


@pytest.mark.parametrize("name,trainer_cls,config_cls,overrides", WHOLE_GROUP, ids=[c[0] for c in WHOLE_GROUP])
def test_group_methods_need_batch_size_multiple_of_num_generations(tmp_path, name, trainer_cls, config_cls, overrides):
    # TRL's config accepts it: the generation batch (6 x 2 = 12) holds whole groups, a micro-batch (6) does not.
    args = _config(config_cls, tmp_path, per_device_train_batch_size=6, num_generations=4, steps_per_generation=2,
                   **overrides)  # fmt: skip
    _raises_at_construction(trainer_cls, args, r"per_device_train_batch_size \(6\) must be a multiple of "
                                               r"num_generations \(4\)\. Use per_device_train_batch_size in \[4, 8")


@pytest.mark.parametrize("method", ["echo", "grpo_fix", "ctpo"])
def test_token_level_methods_accept_partial_groups(tmp_path, method):
    trainer_cls, config_cls, overrides = METHODS[method]
    trainer_cls.validate_args(_config(config_cls, tmp_path, per_device_train_batch_size=6, num_generations=4,
                                      steps_per_generation=2, **overrides))  # fmt: skip


@pytest.mark.parametrize("name,trainer_cls,config_cls,overrides", WHOLE_GROUP, ids=[c[0] for c in WHOLE_GROUP])
def test_group_methods_need_two_generations(tmp_path, name, trainer_cls, config_cls, overrides):
    """Unreachable through the config (TRL's __post_init__ refuses 1), but a config mutated afterwards is caught."""
    args = _config(config_cls, tmp_path, **overrides)
    args.num_generations = 1
    _raises_at_construction(trainer_cls, args, r"num_generations must be >= 2, got 1")


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo", "not_a_loss"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_surrogate_replacing_loss_types_rejected_by_every_trainer(tmp_path, method, loss_type):
    trainer_cls, config_cls, overrides = METHODS[method]
    args = _config(config_cls, tmp_path, loss_type=loss_type, **overrides)  # every config accepts it...
    _raises_at_construction(trainer_cls, args, rf"loss_type='{loss_type}' is not supported by {trainer_cls.__name__}: "
                                               r".*Use one of \('grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'\)")


@pytest.mark.parametrize("method", ["echo", "dfpo", "grpo_fix", "ctpo"])
def test_delta_rejected_where_the_objective_has_no_two_sided_clip(tmp_path, method):
    trainer_cls, config_cls, overrides = METHODS[method]
    args = _config(config_cls, tmp_path, delta=2.0, **overrides)
    _raises_at_construction(trainer_cls, args, rf"delta=2.0 has no meaning for {trainer_cls.__name__}'s objective; "
                                               r"leave delta=None")


def test_delta_accepted_where_trl_surrogate_is_used(tmp_path):
    """OTB (TRL's clipped surrogate on OTB advantages) and the base trainer honour TRL's delta."""
    OTBTrainer.validate_args(_config(OTBConfig, tmp_path, delta=2.0))
    GroupOptTrainer.validate_args(_config(GRPOConfig, tmp_path, delta=2.0))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_liger_and_unsloth_routing_on_the_real_trainers(tmp_path, method):
    """TRL 1.16 keeps the loss in `_compute_loss` under Liger: every trainer passes the check. An old-TRL Liger route
    (`compute_liger_loss`) or an Unsloth-derived class is refused by the constructor, before any model is loaded."""
    trainer_cls, config_cls, overrides = METHODS[method]
    check_loss_routed_through_compute_loss(trainer_cls, use_liger_kernel=True)
    liger_args = _config(config_cls, tmp_path, use_liger_kernel=True, **overrides)
    old_trl = type("OldTRL" + trainer_cls.__name__, (trainer_cls,), {"compute_liger_loss": lambda self, *a: None})
    with pytest.raises(ValueError, match=r"Set use_liger_kernel=False, or upgrade to trl>=1\.16"):
        old_trl(None, None, args=liger_args)
    unsloth = type("UnslothGRPOTrainer", (trainer_cls,), {})
    unsloth.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    with pytest.raises(ValueError, match=r"Unsloth's patched GRPOTrainer replaces `compute_loss`.*Import "
                                         r"trl_groupopt in a process that does not import unsloth"):
        unsloth(None, None, args=_config(config_cls, tmp_path, **overrides))


# ================================================================================================ raised at the first loss
@pytest.mark.parametrize("trainer_cls,config_cls", [(GroupOptTrainer, GRPOConfig)], ids=["grpo"])
def test_trl_surrogate_settings_checked_at_first_loss(tmp_path, trainer_cls, config_cls):
    """The base trainer uses TRL's surrogate, whose settings TRL does not validate: a negative epsilon or an unknown
    importance_sampling_level passes config and trainer construction and raises at the first loss. (OTBConfig
    rejects both at construction: tests/trainers/test_otb_trainer.py.)"""
    tokenizer = tiny_tokenizer()
    batch = {k: v for k, v in random_batch(tokenizer, group_size=2).items() if not k.endswith("_noise")}
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.5, 0.25])
    for bad, match in (({"epsilon": -0.1}, r"epsilons must be >= 0, got epsilon_low=-0\.1"),
                       ({"importance_sampling_level": "tokens"},
                        r"importance_sampling_level must be 'token' or 'sequence', got 'tokens'")):  # fmt: skip
        args = _config(config_cls, tmp_path, **bad)
        trainer_cls.validate_args(args)  # not caught before training
        trainer = trainer_cls(tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(4),
                              processing_class=tokenizer)  # fmt: skip
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        with pytest.raises(ValueError, match=match):
            trainer._compute_loss(trainer.model, dict(batch))


# ================================================================================================ gaps found, now fixed
@pytest.mark.parametrize("level", ["sequence", "tokens"])
def test_echo_rejects_non_token_importance_sampling_level(tmp_path, level):
    with pytest.raises(ValueError, match=r"importance_sampling_level='token'"):
        _config(ECHOConfig, tmp_path, importance_sampling_level=level)
