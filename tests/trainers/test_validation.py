"""Every invalid configuration raises a `ValueError` whose message names the fix, at a stated point:

* "config": the config's `__post_init__` (ours, or TRL's `GRPOConfig`), i.e. when the config object is built,
  including `TrlParser` / `--config` YAML parsing in the example scripts;
* "trainer": `GroupOptTrainer.__init__`, which calls `validate_args` and the Liger/Unsloth routing check *before*
  `GRPOTrainer.__init__`, so no model is loaded (these tests pass `model=None` to prove it);
* "first loss": the objective's own argument check, at the first `_compute_loss` (after the first generation).

Methods come from the registry (`trl_groupopt.METHODS`); where a check depends on the method (whole groups, delta)
the expectation is the trainer's own declaration (`needs_whole_groups`, `supports_delta`), and the built-in methods'
declarations are pinned by a table. The routing check (`check_loss_routed_through_compute_loss`) is also tested on synthetic Unsloth / old-TRL classes.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import (
    BUILT_IN_METHODS,
    assert_registered,
    cpu_config_kwargs,
    length_reward,
    method_config,
    random_batch,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from tests.selection import tested_methods
from trl_groupopt import METHODS, get_method
from trl_groupopt.trainer.base import GroupOptTrainer
from trl_groupopt.trainer.compat import check_loss_routed_through_compute_loss

#: Pinned declarations of the built-in methods: whether they couple the sequences of a group (then every micro-batch
#: holds whole groups) and whether TRL's `delta` (two-sided clip of TRL's surrogate) means anything for them. A method
#: without an entry is tested with what its trainer declares (every test below reads the declaration, not the table).
WHOLE_GROUPS = {"grpo": False, "echo": False, "dfpo": True, "grpo_fix": False, "ctpo": False, "otb": True}
SUPPORTS_DELTA = {"grpo": True, "echo": False, "dfpo": False, "grpo_fix": False, "ctpo": False, "otb": True}
#: Modes that are not registered methods of their own, checked alongside the registered ones.
DFPO_TRANSFORMS = ("min_replace", "orth_proj", "orth_proj_qp", "none")


def _needs_whole_groups(method: str, **overrides) -> bool:
    return get_method(method).trainer_class.needs_whole_groups(method_config(method, "unused", **overrides))


def test_built_in_declarations():
    assert_registered(WHOLE_GROUPS)
    assert_registered(SUPPORTS_DELTA)
    assert set(WHOLE_GROUPS) == set(SUPPORTS_DELTA) <= BUILT_IN_METHODS
    assert {m: _needs_whole_groups(m) for m in WHOLE_GROUPS} == WHOLE_GROUPS
    assert {m: get_method(m).trainer_class.supports_delta for m in SUPPORTS_DELTA} == SUPPORTS_DELTA
    assert all(_needs_whole_groups("dfpo", dfpo_transform=t) for t in DFPO_TRANSFORMS)


def _config(method, tmp_path, **kwargs):
    return method_config(method, tmp_path, **kwargs)


def _raises_at_construction(trainer_cls, args, match):
    """`trainer_cls.validate_args(args)` raises, and so does the constructor, before any model is touched."""
    with pytest.raises(ValueError, match=match):
        trainer_cls.validate_args(args)
    with pytest.raises(ValueError, match=match):
        trainer_cls(None, None, args=args)


# ================================================================================================ raised by the config
CONFIG_CASES = [
    # ECHO: positive clip widths, batch lower bound 1 - batch_epsilon > 0
    ("echo_epsilon_zero", "echo", {"epsilon": 0.0}, r"epsilon must be > 0, got 0"),
    ("echo_epsilon_negative", "echo", {"epsilon": -0.1}, r"epsilon must be > 0, got -0.1"),
    ("echo_epsilon_high_zero", "echo", {"epsilon_high": 0.0}, r"epsilon_high must be > 0"),
    ("echo_batch_epsilon_zero", "echo", {"batch_epsilon": 0.0}, r"batch_epsilon must be > 0"),
    ("echo_batch_epsilon_negative", "echo", {"batch_epsilon": -0.2}, r"batch_epsilon must be > 0"),
    ("echo_batch_epsilon_high_zero", "echo", {"batch_epsilon_high": 0.0}, r"batch_epsilon_high must be > 0"),
    ("echo_batch_epsilon_one", "echo", {"batch_epsilon": 1.0}, r"batch_epsilon must be < 1 \(the lower batch bound"),
    ("echo_batch_epsilon_above_one", "echo", {"batch_epsilon": 1.5}, r"batch_epsilon must be < 1"),
    # batch_epsilon defaults to epsilon, so a token epsilon >= 1 trips the batch bound (message names batch_epsilon)
    ("echo_epsilon_above_one_default_batch", "echo", {"epsilon": 1.5}, r"batch_epsilon must be < 1"),
    (
        "echo_unknown_scope",
        "echo",
        {"batch_ratio_scope": "batch"},
        r"batch_ratio_scope must be one of \('step', 'global', 'micro_batch'\)",
    ),
    ("echo_step_loss_grpo", "echo", {"batch_ratio_scope": "step", "loss_type": "grpo"}, r"loss_type='grpo'"),
    (
        "echo_step_straddles_generations",
        "echo",
        {"batch_ratio_scope": "step", "steps_per_generation": 1, "gradient_accumulation_steps": 2},
        r"steps_per_generation \* num_iterations = 1 not a multiple of gradient_accumulation_steps = 2",
    ),
    (
        "echo_global_loss_grpo",
        "echo",
        {"batch_ratio_scope": "global", "loss_type": "grpo"},
        r"incompatible: loss_type='grpo' \(use one of \('dapo', 'dr_grpo'\)\)\. Use batch_ratio_scope='micro_batch'",
    ),
    ("echo_global_loss_bnpo", "echo", {"batch_ratio_scope": "global", "loss_type": "bnpo"}, r"loss_type='bnpo'"),
    ("echo_global_loss_luspo", "echo", {"batch_ratio_scope": "global", "loss_type": "luspo"}, r"loss_type='luspo'"),
    (
        # the loss multipliers are exact in the wide scopes (issue 26): only the normaliser is named
        "echo_global_all_at_once",
        "echo",
        {
            "batch_ratio_scope": "global",
            "loss_type": "grpo",
            "top_entropy_quantile": 0.5,
            "off_policy_mask_threshold": 1.0,
            "use_vllm": True,
        },
        r"incompatible: loss_type='grpo' \(use one of \('dapo', 'dr_grpo'\)\)\. Use batch_ratio_scope='micro_batch'",
    ),
    # CTPO: log-space bounds, position power, token-level ratios
    ("ctpo_epsilon_zero", "ctpo", {"epsilon": 0.0}, r"epsilon must be > 0 for CTPO \(a log-space bound\)"),
    ("ctpo_epsilon_negative", "ctpo", {"epsilon": -0.025}, r"epsilon must be > 0 for CTPO"),
    ("ctpo_epsilon_high_zero", "ctpo", {"epsilon_high": 0.0}, r"epsilon_high must be > 0 for CTPO"),
    ("ctpo_epsilon_high_negative", "ctpo", {"epsilon_high": -0.05}, r"epsilon_high must be > 0 for CTPO"),
    ("ctpo_dual_clip_zero", "ctpo", {"ctpo_dual_clip": 0.0}, r"ctpo_dual_clip must be > 0 for CTPO"),
    ("ctpo_dual_clip_negative", "ctpo", {"ctpo_dual_clip": -1.0}, r"ctpo_dual_clip must be > 0 for CTPO"),
    (
        "ctpo_position_power_negative",
        "ctpo",
        {"ctpo_position_power": -0.5},
        r"ctpo_position_power must be >= 0 with ctpo_ratio_mode='cumprod' .*got -0\.5\. Negative powers",
    ),
    ("ctpo_unknown_ratio_mode", "ctpo", {"ctpo_ratio_mode": "mean"}, r"ctpo_ratio_mode must be one of"),
    (
        "ctpo_nan_position_power",
        "ctpo",
        {"ctpo_ratio_mode": "geomean", "ctpo_position_power": float("nan")},
        r"ctpo_position_power must be finite, got nan",
    ),
    (
        "ctpo_sequence_level",
        "ctpo",
        {"importance_sampling_level": "sequence"},
        r"set importance_sampling_level='token' \(got 'sequence'\)",
    ),
    # DFPO / GRPO-fix
    ("dfpo_epsilon_zero", "dfpo", {"epsilon": 0.0}, r"epsilon must be > 0"),
    ("dfpo_epsilon_high_negative", "dfpo", {"epsilon_high": -4e-4}, r"epsilon_high must be > 0"),
    (
        "dfpo_orth_floor_zero",
        "dfpo",
        {"dfpo_transform": "orth_proj", "dfpo_orth_floor": 0.0},
        r"dfpo_orth_floor must be > 0",
    ),
    ("grpo_fix_epsilon_high_zero", "grpo_fix", {"epsilon_high": 0.0}, r"epsilon_high must be > 0"),
    (
        "dfpo_unknown_transform",
        "dfpo",
        {"dfpo_transform": "min-replace"},
        r"dfpo_transform must be one of \('none', 'min_replace', 'orth_proj', 'orth_proj_qp', 'symmetric_clip'\), "
        r"got 'min-replace'",
    ),
    (
        "dfpo_token_level",
        "dfpo",
        {"importance_sampling_level": "token"},
        r"dfpo_transform='min_replace' uses sequence-level ratios: leave importance_sampling_level unset or set it to "
        r"'sequence' \(got 'token'\)",
    ),
    (
        "grpo_fix_sequence_level",
        "grpo_fix",
        {"importance_sampling_level": "sequence"},
        r"uses token-level ratios: leave importance_sampling_level unset or set it to 'token'",
    ),
    # group methods: at least two generations (TRL's own GRPOConfig check fires first)
    ("dfpo_one_generation", "dfpo", {"num_generations": 1}, r"at least 2 generations per prompt"),
    ("otb_one_generation", "otb", {"num_generations": 1}, r"at least 2 generations per prompt"),
    ("grpo_one_generation", "grpo", {"num_generations": 1}, r"at least 2 generations per prompt"),
]


@pytest.mark.parametrize("name,method,kwargs,match", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_invalid_config_raises_at_construction(tmp_path, name, method, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _config(method, tmp_path, **kwargs)


def test_config_cases_name_registered_methods():
    assert_registered({method for _, method, _, _ in CONFIG_CASES}, "CONFIG_CASES")


def test_valid_neighbours_of_the_invalid_configs_construct(tmp_path):
    """The bounds are where the messages say (so the cases above test the bound, not a typo)."""
    echo = _config("echo", tmp_path, epsilon=1.5, batch_epsilon=0.99, batch_epsilon_high=5.0)
    assert (echo.batch_epsilon, echo.batch_epsilon_high) == (0.99, 5.0)
    assert _config("echo", tmp_path, batch_ratio_scope="global", loss_type="dr_grpo").loss_type == "dr_grpo"
    _config("echo", tmp_path, batch_ratio_scope="global", use_vllm=True, vllm_importance_sampling_correction=False)
    for scope in ("global", "step"):  # TRL's per-token loss multipliers are exact in the wide scopes
        args = _config("echo", tmp_path, batch_ratio_scope=scope, use_vllm=True, top_entropy_quantile=0.5,
                       off_policy_mask_threshold=0.5)  # fmt: skip
        assert args.batch_ratio_scope == scope and args.vllm_importance_sampling_correction
    assert _config("ctpo", tmp_path, ctpo_position_power=0.0, epsilon_high=None).epsilon_high == 0.025
    assert _config("dfpo", tmp_path, importance_sampling_level="sequence").importance_sampling_level == "sequence"
    grpo_fix = _config("grpo_fix", tmp_path)
    assert (grpo_fix.importance_sampling_level, grpo_fix.epsilon_high) == ("token", 0.2)
    for transform in ("none", "min_replace", "orth_proj", "orth_proj_qp"):
        assert _config("dfpo", tmp_path, dfpo_transform=transform).importance_sampling_level == "sequence"


# ================================================================================================ raised by the trainer
WHOLE_GROUP_CASES = [(m, {}) for m in METHODS if _needs_whole_groups(m)] + [
    ("dfpo", {"dfpo_transform": t}) for t in DFPO_TRANSFORMS
]
WHOLE_GROUP_IDS = [m + "".join(f"-{v}" for v in o.values()) for m, o in WHOLE_GROUP_CASES]


@pytest.mark.parametrize("method,overrides", WHOLE_GROUP_CASES, ids=WHOLE_GROUP_IDS)
def test_group_methods_need_batch_size_multiple_of_num_generations(tmp_path, method, overrides):
    # TRL's config accepts it: the generation batch (6 x 2 = 12) holds whole groups, a micro-batch (6) does not.
    args = _config(method, tmp_path, per_device_train_batch_size=6, num_generations=4, steps_per_generation=2,
                   **overrides)  # fmt: skip
    _raises_at_construction(get_method(method).trainer_class, args,
                            r"per_device_train_batch_size \(6\) must be a multiple of num_generations \(4\)\. "
                            r"Use per_device_train_batch_size in \[4, 8, 12, 16\]")  # fmt: skip


@pytest.mark.parametrize("method", [m for m in METHODS if not _needs_whole_groups(m)])
def test_token_level_methods_accept_partial_groups(tmp_path, method):
    get_method(method).trainer_class.validate_args(
        _config(method, tmp_path, per_device_train_batch_size=6, num_generations=4, steps_per_generation=2)
    )


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo", "not_a_loss"])
@pytest.mark.parametrize("method", tested_methods())
def test_surrogate_replacing_loss_types_rejected_by_every_trainer(tmp_path, method, loss_type):
    """A trainer with its own objective refuses TRL's surrogate-replacing loss types; the base trainer (TRL's GRPO)
    hands them to TRL's own `_compute_loss` (trained in tests/e2e/test_dropin_training.py). Unknown names always
    fail."""
    trainer_cls = get_method(method).trainer_class
    args = _config(method, tmp_path, loss_type=loss_type)  # every config accepts it...
    if loss_type != "not_a_loss" and not trainer_cls.has_own_objective:
        trainer_cls.validate_args(args)
        return
    _raises_at_construction(
        trainer_cls,
        args,
        rf"loss_type='{loss_type}' is not supported by {trainer_cls.__name__}: "
        r".*Use one of \('grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'\)",
    )


def test_surrogate_replacing_loss_types_raise_only_with_an_own_objective(tmp_path):
    class OwnObjective(GroupOptTrainer):
        def objective(self, *args, **kwargs):
            raise NotImplementedError

    assert OwnObjective.has_own_objective and not GroupOptTrainer.has_own_objective
    for loss_type in ("cispo", "sapo", "vespo"):
        with pytest.raises(ValueError, match="Use one of"):
            OwnObjective.validate_args(_config("grpo", tmp_path, loss_type=loss_type))
        GroupOptTrainer.validate_args(_config("grpo", tmp_path, loss_type=loss_type))


@pytest.mark.parametrize("method", tested_methods())
def test_delta_only_where_the_objective_has_a_two_sided_clip(tmp_path, method):
    """OTB (TRL's clipped surrogate on OTB advantages) and the base trainer honour TRL's delta; the others refuse."""
    trainer_cls = get_method(method).trainer_class
    args = _config(method, tmp_path, delta=2.0)
    if trainer_cls.supports_delta:
        trainer_cls.validate_args(args)
    else:
        _raises_at_construction(trainer_cls, args, rf"delta=2.0 has no meaning for {trainer_cls.__name__}'s "
                                                   r"objective; leave delta=None")  # fmt: skip


@pytest.mark.parametrize("method", tested_methods())
def test_trainer_needs_its_own_config_class(tmp_path, method):
    """A config of another class (a plain GRPOConfig, another method's config) lacks the method's knobs: refused,
    naming the config class to build."""
    trainer_cls = get_method(method).trainer_class
    foreign = {spec.config_class for spec in METHODS.values()} - {trainer_cls.config_class}
    foreign = [c for c in foreign if not issubclass(c, trainer_cls.config_class)]
    if trainer_cls.config_class is not METHODS["grpo"].config_class:
        assert METHODS["grpo"].config_class in foreign  # the check below is not empty for a method's own config
    for config_cls in foreign:
        args = config_cls(**cpu_config_kwargs(tmp_path))
        _raises_at_construction(trainer_cls, args, rf"build the config with {trainer_cls.config_class.__name__}"
                                                   r"\(\.\.\.\)")  # fmt: skip


@pytest.mark.parametrize("method", tested_methods())
def test_liger_and_unsloth_routing_on_the_real_trainers(tmp_path, method):
    """The supported TRL versions keep the loss in `_compute_loss` under Liger: every trainer passes the check. An
    Unsloth-derived class is refused by the constructor, before any model is loaded."""
    trainer_cls = get_method(method).trainer_class
    check_loss_routed_through_compute_loss(trainer_cls)
    unsloth = type("UnslothGRPOTrainer", (trainer_cls,), {})
    unsloth.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    with pytest.raises(
        ValueError,
        match=r"Unsloth's patched GRPOTrainer replaces `compute_loss`.*Import "
        r"trl_groupopt in a process that does not import unsloth",
    ):
        unsloth(None, None, args=_config(method, tmp_path))


def test_routing_check_sees_through_subclasses_and_foreign_patches():
    """A class of ours built on top of Unsloth's generated trainer is refused too, and so is a `compute_loss` patched
    in from another module (the loss would no longer reach `_compute_loss`)."""
    fake_unsloth = type("UnslothGRPOTrainer", (GroupOptTrainer,), {})
    fake_unsloth.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    ours_on_top = type("ECHOLikeTrainer", (fake_unsloth,), {})
    with pytest.raises(ValueError, match="Unsloth"):
        check_loss_routed_through_compute_loss(ours_on_top)
    patched = type("Patched", (GroupOptTrainer,), {"compute_loss": lambda self, *a, **k: None})
    patched.compute_loss.__module__ = "somebody_elses_patch"
    with pytest.raises(ValueError, match="not TRL"):
        check_loss_routed_through_compute_loss(patched)


def test_liger_on_trl_116_still_computes_our_objective(tmp_path):
    """TRL 1.16 only patches model kernels under Liger: the loss still goes through our `_compute_loss`."""
    calls = []

    class Recording(GroupOptTrainer):
        def objective(self, *args, **kwargs):
            calls.append(1)
            return super().objective(*args, **kwargs)

    tokenizer = tiny_tokenizer()
    trainer = Recording(tiny_model(tokenizer), length_reward, args=_config("grpo", tmp_path, use_liger_kernel=True),
                        train_dataset=tiny_dataset(8), processing_class=tokenizer)  # fmt: skip
    assert trainer.args.liger_kernel_config == {"fused_linear_cross_entropy": False}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = {k: v for k, v in random_batch(tokenizer).items() if not k.endswith("_noise")}
    loss = trainer.compute_loss(trainer.model, batch)
    assert calls == [1] and torch.isfinite(loss)


# ================================================================================================ raised at the first loss
@pytest.mark.parametrize("method", ["grpo"])
def test_trl_surrogate_settings_checked_at_first_loss(tmp_path, method):
    """The base trainer uses TRL's surrogate, whose settings TRL does not validate: an unknown importance_sampling_level
    passes config and trainer construction and raises at the first loss. (OTBConfig rejects it at construction:
    tests/trainers/test_otb_trainer.py; a negative epsilon is refused at construction for every trainer since issue 38:
    tests/trainers/test_args_check.py.)"""
    tokenizer = tiny_tokenizer()
    batch = {k: v for k, v in random_batch(tokenizer, group_size=2).items() if not k.endswith("_noise")}
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.5, 0.25])
    for bad, match in (({"importance_sampling_level": "tokens"},
                        r"importance_sampling_level must be 'token' or 'sequence', got 'tokens'"),):  # fmt: skip
        trainer_cls = get_method(method).trainer_class
        args = _config(method, tmp_path, **bad)
        trainer_cls.validate_args(args)  # not caught before training
        trainer = trainer_cls(tiny_model(tokenizer), length_reward, args=args, train_dataset=tiny_dataset(4),
                              processing_class=tokenizer)  # fmt: skip
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        with pytest.raises(ValueError, match=match):
            trainer._compute_loss(trainer.model, dict(batch))


@pytest.mark.parametrize("level", ["sequence", "tokens"])
def test_echo_rejects_non_token_importance_sampling_level(tmp_path, level):
    with pytest.raises(ValueError, match=r"importance_sampling_level='token'"):
        _config("echo", tmp_path, importance_sampling_level=level)


@pytest.mark.parametrize("method", tested_methods())
def test_training_set_smaller_than_one_generation_batch_raises(tmp_path, method):
    # TRL's RepeatSampler drops incomplete generation batches: with 3 prompts and a generation batch of 4 prompts
    # (8 sequences x 2 steps per generation / groups of 4) TRL would train zero steps without a word.
    args = _config(method, tmp_path, per_device_train_batch_size=8, num_generations=4, steps_per_generation=2)
    trainer_cls = get_method(method).trainer_class
    with pytest.raises(ValueError, match=r"holds 3 prompts but one generation batch needs 4 .*zero steps"):
        trainer_cls(tiny_model(tiny_tokenizer()), length_reward, args=args, train_dataset=tiny_dataset(3),
                    processing_class=tiny_tokenizer())  # fmt: skip
    trainer_cls(tiny_model(tiny_tokenizer()), length_reward, args=args, train_dataset=tiny_dataset(4),
                processing_class=tiny_tokenizer())  # fmt: skip
