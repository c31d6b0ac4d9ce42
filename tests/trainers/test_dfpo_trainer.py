"""DFPOTrainer: every knob reaches the objective, IS weights are applied once, and all-equal-reward groups (TRL's own
float32 advantages) contribute nothing. arXiv:2604.13088; docs/dfpo.md. The residual logged in a training run:
tests/e2e/test_dfpo_training.py."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import (
    _forward,
    clone_model,
    compute_loss_and_grads,
    cpu_config_kwargs,
    inputs_with_policies,
    length_reward,
    random_batch,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from tests.objectives.groups import groups_of
from trl_groupopt import DFPOConfig, DFPOTrainer
from trl_groupopt.data.offline import load_embedded_policy
from trl_groupopt.methods.dfpo.grpo_fix import symmetric_clip_loss
from trl_groupopt.methods.dfpo.objective import dfpo_loss
from trl_groupopt.trainer.batching import EQUAL_REWARDS

WIDE = dict(epsilon=0.05, epsilon_high=0.08)  # some sequences clipped, some not, at off_policy_scale 0.3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=5), tmp_path_factory.mktemp("dfpo_trainer")


def _trainer(tiny, name, **overrides):
    tokenizer, model, tmp = tiny
    kwargs = dict(per_device_train_batch_size=6, num_generations=3, **overrides)
    args = DFPOConfig(**cpu_config_kwargs(tmp / name, **kwargs))
    trainer = DFPOTrainer(clone_model(model), length_reward, args=args, train_dataset=tiny_dataset(6),
                          processing_class=tokenizer)  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _off_policy_inputs(trainer, seed: int = 21):
    """Two groups of 3, group-centred advantages, behaviour log-probs 0.3 off the trainer's model."""
    batch = random_batch(trainer.processing_class, batch_size=6, group_size=3, seed=seed, off_policy_scale=0.3,
                         with_ref=False)  # fmt: skip
    groups = batch["advantages"].view(-1, 3)
    batch["advantages"] = (groups - groups.mean(1, keepdim=True)).flatten()
    return inputs_with_policies(trainer, batch)


def _predicted(trainer, inputs, *, is_weights=None) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the pure function on the trainer's own forward, with the trainer's args, `dapo`."""
    args = trainer.args
    trainer.model.zero_grad(set_to_none=True)
    logps, _, _ = _forward(trainer, trainer.model, inputs)
    mask = inputs["completion_mask"].float()
    if args.dfpo_transform == "symmetric_clip":
        out = symmetric_clip_loss(logps, inputs["old_per_token_logps"], inputs["advantages"], mask,
                                  epsilon_high=args.epsilon_high, importance_weights=is_weights)  # fmt: skip
    else:
        groups = groups_of(inputs["group_ids"])
        out = dfpo_loss(logps, inputs["old_per_token_logps"], inputs["advantages"], mask, groups,
                        transform=args.dfpo_transform, epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                        orth_floor=args.dfpo_orth_floor, orthogonal_over=args.dfpo_orthogonal_over,
                        importance_weights=is_weights)  # fmt: skip
    assert args.loss_type == "dapo"
    loss = (out.per_token_loss * mask).sum() / inputs["num_items_in_batch"]
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return loss.item(), grads


def _assert_matches(result, predicted):
    (loss, grads, _), (want_loss, want_grads) = result, predicted
    assert loss.item() == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    assert grads.keys() == want_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-4, atol=1e-7, msg=name)


def _grad_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Relative distance between two gradients (over all parameters)."""
    num = sum(float((a[n] - b[n]).norm() ** 2) for n in a)
    den = sum(float(a[n].norm() ** 2) for n in a)
    return math.sqrt(num / max(den, 1e-30))


KNOBS = [  # (knob, config A, config B): B differs from A in one knob only
    ("transform", {"dfpo_transform": "min_replace"}, {"dfpo_transform": "orth_proj"}),
    ("transform_qp", {"dfpo_transform": "orth_proj"}, {"dfpo_transform": "orth_proj_qp"}),
    ("transform_none", {"dfpo_transform": "none"}, {"dfpo_transform": "min_replace"}),
    ("epsilon", {"epsilon": 0.05}, {"epsilon": 0.3}),
    ("epsilon_high", {"epsilon_high": 0.08}, {"epsilon_high": 0.4}),
    ("orth_floor", {"dfpo_transform": "orth_proj"}, {"dfpo_transform": "orth_proj", "dfpo_orth_floor": 0.97}),
    ("orthogonal_over", {"dfpo_transform": "orth_proj"},
     {"dfpo_transform": "orth_proj", "dfpo_orthogonal_over": "unclipped"}),
    ("orthogonal_over_qp", {"dfpo_transform": "orth_proj_qp"},
     {"dfpo_transform": "orth_proj_qp", "dfpo_orthogonal_over": "unclipped"}),
    ("grpo_fix_epsilon_high", {"dfpo_transform": "symmetric_clip", "epsilon_high": 0.05},
     {"dfpo_transform": "symmetric_clip", "epsilon_high": 0.3}),
    ("grpo_fix_mode", {"dfpo_transform": "none"}, {"dfpo_transform": "symmetric_clip", "epsilon_high": 0.08}),
]  # fmt: skip


@pytest.mark.parametrize("knob,config_a,config_b", KNOBS, ids=[k[0] for k in KNOBS])
def test_knob_reaches_the_objective(tiny, knob, config_a, config_b):
    """Changing one knob changes the trainer's loss and gradient exactly as the pure function predicts (a knob the
    trainer did not pass through would leave them at A's values while the prediction moves)."""
    predicted = []
    for tag, config in (("a", config_a), ("b", config_b)):
        trainer = _trainer(tiny, f"{knob}-{tag}", **{**WIDE, **config})
        inputs = _off_policy_inputs(trainer)
        result = compute_loss_and_grads(trainer, inputs)
        predicted.append(_predicted(trainer, inputs))
        _assert_matches(result, predicted[-1])
    assert _grad_distance(predicted[0][1], predicted[1][1]) > 1e-3, "knob inert on this batch: the test cannot fail"


@pytest.mark.parametrize("transform", ["orth_proj", "none", "symmetric_clip"])
@pytest.mark.parametrize("shape", ["sequence", "token"])
def test_vllm_importance_weights_applied_once(tiny, transform, shape):
    """With vLLM IS correction the objective applies TRL's weights (inside the transform for DFPO); the base does
    not multiply them again."""
    overrides = {**WIDE, "dfpo_transform": transform}
    if transform == "symmetric_clip":
        overrides["epsilon_high"] = 0.08
    trainer = _trainer(tiny, f"is-{transform}-{shape}", **overrides)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # as TRL sets them with vLLM
    inputs = _off_policy_inputs(trainer, seed=22)
    gen = torch.Generator().manual_seed(3)
    size = (6, 1) if shape == "sequence" else inputs["completion_mask"].shape
    inputs["importance_sampling_ratio"] = 0.5 + torch.rand(size, generator=gen)
    result = compute_loss_and_grads(trainer, inputs)
    expected = _predicted(trainer, inputs, is_weights=inputs["importance_sampling_ratio"])
    _assert_matches(result, expected)
    assert _grad_distance(expected[1], _predicted(trainer, inputs)[1]) > 1e-3  # the weights matter here


def test_all_equal_rewards_contribute_nothing_on_the_embedded_policy(tmp_path):
    """TRL's own advantage computation on a group whose rewards are all 0.1 (float32 noise of ~1e-4): every DFPO
    transform gives zero loss and zero gradient; 'none' (GSPO) pushes the group. The trainer's `compute_advantages`
    gives such a group exact zeros (the equal-reward rule, `batching.EQUAL_REWARDS`), so the rule is lifted here and
    TRL's noise put in the batch as TRL computes it."""
    from trl.trainer.utils import nanstd

    model, tokenizer = load_embedded_policy()
    args = DFPOConfig(**cpu_config_kwargs(tmp_path, per_device_train_batch_size=8, num_generations=8))
    trainer = DFPOTrainer(model, lambda completions, **kw: [0.1] * len(completions), args=args,
                          train_dataset=tiny_dataset(8), processing_class=tokenizer)  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions([tiny_dataset(8)[0]] * 8)
    advantages = trainer.compute_advantages(inputs, None, inputs["completion_mask"])
    assert bool((advantages == 0).all())  # the trainer's rule: an equal-reward group has no signal
    assert bool(inputs.pop(EQUAL_REWARDS).all())  # lifted: the advantages below reach the objective
    rewards = torch.full((1, 8), 0.1)  # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0)
    noise = (rewards - torch.nanmean(rewards, dim=1, keepdim=True)) / (nanstd(rewards, dim=1).unsqueeze(1) + 1e-4)
    inputs["advantages"] = noise.view(-1)
    assert bool((inputs["advantages"] != 0).all()) and inputs["advantages"].abs().max() < 1e-3  # the noise
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logps, _, _ = _forward(trainer, trainer.model, inputs)
    inputs["old_per_token_logps"] = logps + 1e-4 * torch.randn(logps.shape, generator=gen)  # off-policy
    for transform in ("min_replace", "orth_proj", "orth_proj_qp", "none"):
        trainer.args.dfpo_transform = transform
        loss, grads, _ = compute_loss_and_grads(trainer, inputs)
        if transform == "none":
            assert loss != 0 and any(bool((g != 0).any()) for g in grads.values())
        else:
            assert loss == 0 and all(bool((g == 0).all()) for g in grads.values()), transform


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"dfpo_transform": "min_replace", "dfpo_orthogonal_over": "unclipped"},
         r"dfpo_orthogonal_over='unclipped' needs .* not dfpo_transform='min_replace' .* Use "
         r"dfpo_transform='orth_proj' or 'orth_proj_qp', or dfpo_orthogonal_over='all'"),
        ({"dfpo_transform": "none", "dfpo_orthogonal_over": "unclipped"}, r"not dfpo_transform='none'"),
        ({"dfpo_transform": "symmetric_clip", "dfpo_orthogonal_over": "unclipped"},
         r"dfpo_orthogonal_over='unclipped' needs one of DFPO's in-group transforms, not GRPO-fix .*leave it 'all'"),
        ({"dfpo_orthogonal_over": "clipped"}, r"dfpo_orthogonal_over must be one of \('all', 'unclipped'\)"),
    ],
)  # fmt: skip
def test_orthogonal_over_rejected_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        DFPOConfig(**cpu_config_kwargs(tmp_path, **overrides))


def test_config_defaults(tmp_path):
    """DFPO and GRPO-fix default to loss_type='dapo' (shared-token cancellation with ragged lengths) and the
    paper's constraint over the whole group; 'grpo' stays selectable."""
    for transform in ("min_replace", "symmetric_clip"):
        args = DFPOConfig(**cpu_config_kwargs(tmp_path, dfpo_transform=transform))
        assert args.loss_type == "dapo" and args.dfpo_orthogonal_over == "all"
    assert DFPOConfig(**cpu_config_kwargs(tmp_path, loss_type="grpo")).loss_type == "grpo"
    args = DFPOConfig(**cpu_config_kwargs(tmp_path, dfpo_transform="orth_proj_qp", dfpo_orthogonal_over="unclipped"))
    assert args.dfpo_orthogonal_over == "unclipped"
