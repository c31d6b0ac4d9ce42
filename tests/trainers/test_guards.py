"""Guards: configs and environments under which the trainer would train something else raise a clear error."""


import pytest
import torch
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs, length_reward, random_batch, tiny_dataset, tiny_model, tiny_tokenizer
from trl_groupopt.trainers.base import GroupOptTrainer, check_loss_routed_through_compute_loss


class WholeGroupTrainer(GroupOptTrainer):
    requires_whole_groups = True
    supports_delta = False


def _args(tmp_path, **overrides):
    return GRPOConfig(**cpu_config_kwargs(tmp_path, **overrides))


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_surrogate_replacing_loss_types_raise_only_with_an_own_objective(tmp_path, loss_type):
    class OwnObjective(GroupOptTrainer):
        def objective(self, *args, **kwargs):
            raise NotImplementedError

    with pytest.raises(ValueError, match="Use one of"):
        OwnObjective.validate_args(_args(tmp_path, loss_type=loss_type))
    GroupOptTrainer.validate_args(_args(tmp_path, loss_type=loss_type))  # TRL's own loss (tests/trainers/test_dropin.py)


def test_group_methods_need_whole_groups_per_micro_batch(tmp_path):
    args = _args(tmp_path, per_device_train_batch_size=6, num_generations=4, steps_per_generation=2)
    with pytest.raises(ValueError, match=r"per_device_train_batch_size \(6\) must be a multiple of num_generations "
                                         r"\(4\)\. Use per_device_train_batch_size in \[4, 8, 12, 16\]"):
        WholeGroupTrainer.validate_args(args)
    GroupOptTrainer.validate_args(args)  # token-level methods do not care


def test_group_methods_need_two_generations(tmp_path):
    args = _args(tmp_path)
    args.num_generations = 1
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        WholeGroupTrainer.validate_args(args)


def test_delta_rejected_where_meaningless(tmp_path):
    with pytest.raises(ValueError, match="leave delta=None"):
        WholeGroupTrainer.validate_args(_args(tmp_path, delta=2.0))


def test_unsloth_patched_trainer_is_refused():
    # Unsloth rebinds trl.GRPOTrainer to a generated class living in an `unsloth...` module.
    fake_unsloth = type("UnslothGRPOTrainer", (GroupOptTrainer,), {})
    fake_unsloth.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    ours_on_top = type("ECHOLikeTrainer", (fake_unsloth,), {})
    with pytest.raises(ValueError, match="Unsloth"):
        check_loss_routed_through_compute_loss(ours_on_top, use_liger_kernel=False)
    # A compute_loss patched in from elsewhere is refused too.
    patched = type("Patched", (GroupOptTrainer,), {"compute_loss": lambda self, *a, **k: None})
    patched.compute_loss.__module__ = "somebody_elses_patch"
    with pytest.raises(ValueError, match="not TRL"):
        check_loss_routed_through_compute_loss(patched, use_liger_kernel=False)


def test_old_liger_routing_is_refused():
    # TRL <= 1.13 sent use_liger_kernel=True to `compute_liger_loss`, around `_compute_loss`.
    old_trl = type("OldTRLTrainer", (GroupOptTrainer,), {"compute_liger_loss": lambda self, *a: None})
    with pytest.raises(ValueError, match="use_liger_kernel=False"):
        check_loss_routed_through_compute_loss(old_trl, use_liger_kernel=True)
    check_loss_routed_through_compute_loss(old_trl, use_liger_kernel=False)


def test_liger_on_trl_116_still_computes_our_objective(tmp_path):
    """TRL 1.16 only patches model kernels under Liger: the loss still goes through our `_compute_loss`."""
    calls = []

    class Recording(GroupOptTrainer):
        def objective(self, *args, **kwargs):
            calls.append(1)
            return super().objective(*args, **kwargs)

    tokenizer = tiny_tokenizer()
    trainer = Recording(tiny_model(tokenizer), length_reward, args=_args(tmp_path, use_liger_kernel=True),
                        train_dataset=tiny_dataset(8), processing_class=tokenizer)
    assert trainer.args.liger_kernel_config == {"fused_linear_cross_entropy": False}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = {k: v for k, v in random_batch(tokenizer).items() if not k.endswith("_noise")}
    loss = trainer.compute_loss(trainer.model, batch)
    assert calls == [1] and torch.isfinite(loss)


def test_model_card_metadata():
    assert GroupOptTrainer._name and "trl-groupopt" in GroupOptTrainer._tag_names
    assert {"title", "id", "citation"} <= GroupOptTrainer._paper.keys()
    assert GroupOptTrainer._paper["citation"].lstrip().startswith("@")


def test_method_trainer_needs_its_own_config(tmp_path):
    from trl_groupopt import CTPOConfig, DFPOTrainer, ECHOTrainer, OTBTrainer

    for trainer_cls in (ECHOTrainer, DFPOTrainer, OTBTrainer):
        with pytest.raises(ValueError, match=f"{trainer_cls.config_class.__name__}\\(\\.\\.\\.\\)"):
            trainer_cls.validate_args(_args(tmp_path))  # a plain GRPOConfig lacks the method's knobs
    with pytest.raises(ValueError, match="ECHOConfig"):
        ECHOTrainer.validate_args(CTPOConfig(**cpu_config_kwargs(tmp_path)))
