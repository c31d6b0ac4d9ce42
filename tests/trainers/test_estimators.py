"""`advantage_estimator` x objective: every method config picks its advantages from one registry of estimators.

- Composition, float64: for each allowed combination (ECHO, CTPO and GRPO-fix with `advantage_estimator="otb"`, and
  OTB itself, TRL's objective), the loss and gradient of the trainer's `_compute_loss` on a fixed off-policy batch
  equal, to 1e-10, the method's pure objective applied to `otb_advantages(...)` computed here from the raw rewards,
  the energy and the groups, aggregated as `loss_type="dapo"` does. TRL's fused LM head computes in float32, so the
  trainer's forward is a plain float64 log-softmax (as in tests/trainers/test_echo_step_scope.py); the energy of the
  behaviour policy is a batch field, as TRL's behaviour forward leaves it (its capture is tested in
  tests/trainers/test_otb_trainer.py).
- The mechanism inside each combination: on that batch the logged `otb/grad_second_moment` is below
  `otb/grad_second_moment_group_mean_baseline`, and every combination logs the same OTB metrics (one estimator).
- With `"grpo"` nothing of OTB's runs: TRL's fused head is not re-patched and no energy is recorded.
- Configs: the defaults, the refusals (unknown name, a knob of an estimator not selected, OTBConfig without "otb",
  DFPO's transforms with a per-token estimator, naming the reason), the CLI flag, the model card.
- A third estimator (RLOO's leave-one-out mean, registered here) is one registry entry: a method trainer then trains on
  its advantages with no other change.
"""

from __future__ import annotations

import dataclasses
from types import MethodType

import pytest
import torch

from tests.distributed import batches
from tests.helpers import (
    clone_model,
    compute_loss_and_grads,
    cpu_config_kwargs,
    float64_forward,
    length_reward,
    method_config,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
)
from tests.objectives.groups import groups_of
from trl_groupopt import METHODS, DFPOConfig, ECHOConfig, OTBConfig, get_method
from trl_groupopt.core.common import clipped_surrogate_loss
from trl_groupopt.core.estimators import ESTIMATORS, AdvantageEstimator, EstimatorOutput, register_estimator
from trl_groupopt.methods.ctpo.objective import ctpo_loss
from trl_groupopt.methods.dfpo.grpo_fix import symmetric_clip_loss
from trl_groupopt.methods.dfpo.objective import TRANSFORMS
from trl_groupopt.methods.echo.objective import echo_loss
from trl_groupopt.methods.otb.objective import logit_gradient_energy, otb_advantages

ATOL = 1e-10


def _reference_objective(method: str, args):
    """The method's pure objective with its config's hyper-parameters, bound here (not through the trainer)."""
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high  # as GRPOTrainer reads it
    if method == "echo":
        return lambda *a: echo_loss(*a, epsilon_low=args.epsilon, epsilon_high=epsilon_high,
                                    batch_epsilon_low=args.batch_epsilon, batch_epsilon_high=args.batch_epsilon_high,
                                    token_clip=args.token_clip)  # fmt: skip
    if method == "ctpo":
        return lambda *a: ctpo_loss(*a, epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                                    dual_clip=args.ctpo_dual_clip, position_power=args.ctpo_position_power,
                                    ratio_mode=args.ctpo_ratio_mode)  # fmt: skip
    if method == "grpo_fix":
        return lambda *a: symmetric_clip_loss(*a, epsilon_high=args.epsilon_high)
    assert method == "otb"  # TRL's clipped surrogate
    return lambda *a: clipped_surrogate_loss(*a, epsilon_low=args.epsilon, epsilon_high=epsilon_high,
                                             importance_sampling_level=args.importance_sampling_level)  # fmt: skip


#: registry method -> config overrides that give it OTB's advantages (OTB's own config has them by default).
COMBINATIONS = {
    "echo": dict(advantage_estimator="otb"),
    "ctpo": dict(advantage_estimator="otb"),
    "grpo_fix": dict(advantage_estimator="otb"),
    "otb": dict(),
}


def _trainer(method, tmp_path, tokenizer, model, **overrides):
    args = method_config(
        method,
        tmp_path / method,
        per_device_train_batch_size=batches.NUM_ROWS,
        num_generations=batches.GROUP_SIZE,
        max_completion_length=batches.COMPLETION_LEN,
        gradient_accumulation_steps=1,
        steps_per_generation=2,  # off-policy: the clips act
        beta=0.0,
        **overrides,
    )
    trainer = get_method(method).trainer_class(clone_model(model), length_reward, args=args,
                                               train_dataset=tiny_dataset(16), processing_class=tokenizer)  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The float64 model, and the batch: the fixed groups with raw rewards, `group_ids`, off-policy log-ratios
    (`batches.log_ratios("mixed")`) and the behaviour policy's energy from the full logits."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=2).double()
    batch = batches.group_batch(len(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logps, _, _ = float64_forward(None, model, batch)
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, batches.PROMPT_LEN - 1 : -1]
        energy = logit_gradient_energy(logits.double(), batch["completion_ids"])  # (B, T) float64
    inputs = {key: batch[key] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    mask = batch["completion_mask"]
    inputs.update(
        advantages=batch["advantages"].double(),  # TRL's: unused with "otb"
        rewards=batch["rewards_per_func"][:, 0].double(),  # raw
        group_ids=torch.arange(batches.NUM_ROWS) // batches.GROUP_SIZE,
        old_per_token_logps=(logps - batches.log_ratios("mixed").double()).detach(),
        old_per_token_energy=energy,
        num_items_in_batch=2 * mask.sum(),  # the generation batch: 2 micro-batches (steps_per_generation=2)
    )
    return tokenizer, model, inputs, tmp_path_factory.mktemp("estimators")


@pytest.fixture(scope="module")
def float_model(setup):
    """The same model in float32, for the trainers that run TRL's own (float32) fused head."""
    return clone_model(setup[1]).float()


def _reference(method, args, model, inputs):
    """Loss and gradients of the pure objective on independently computed OTB advantages (dapo aggregation)."""
    reference_model = clone_model(model)
    mask = inputs["completion_mask"].double()
    advantages = otb_advantages(inputs["rewards"], inputs["old_per_token_energy"], mask, groups_of(inputs["group_ids"]),
                                handle_zero_tail=False, token_positions="valid")  # fmt: skip
    logps, _, _ = float64_forward(None, reference_model, inputs)
    out = _reference_objective(method, args)(logps, inputs["old_per_token_logps"], advantages, mask)
    normalizer = inputs["num_items_in_batch"] / args.steps_per_generation  # TRL's dapo: one micro-batch's tokens
    loss = (out.per_token_loss * mask).sum() / normalizer
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in reference_model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, advantages


@pytest.fixture(scope="module")
def trained(setup):
    """{method: (trainer, (loss, grads, metrics), advantages the objective received)} on the fixed batch."""
    tokenizer, model, inputs, root = setup
    results = {}
    for method, overrides in COMBINATIONS.items():
        trainer = _trainer(method, root, tokenizer, model, **overrides)
        trainer._forward_logps_and_entropies = MethodType(float64_forward, trainer)
        seen = {}
        objective = trainer.objective

        def recording(per_token_logps, old, advantages, mask, batch, seen=seen, objective=objective, **kwargs):
            seen["advantages"] = advantages.detach().clone()
            return objective(per_token_logps, old, advantages, mask, batch, **kwargs)

        trainer.objective = recording
        results[method] = (trainer, compute_loss_and_grads(trainer, dict(inputs)), seen["advantages"])
    return results


@pytest.mark.parametrize("method", list(COMBINATIONS))
def test_trained_loss_and_gradient_are_the_objective_on_otb_advantages(setup, trained, method):
    _, model, inputs, _ = setup
    trainer, (loss, grads, metrics), received = trained[method]
    assert trainer.estimator.name == "otb" and trainer.whole_groups
    assert metrics["clip_ratio/region_mean"][0] > 0.1  # off-policy: the objective's clips act on this batch
    ref_loss, ref_grads, ref_advantages = _reference(method, trainer.args, model, inputs)
    torch.testing.assert_close(received, ref_advantages, atol=ATOL, rtol=0)
    assert received.shape == inputs["completion_mask"].shape  # per-token advantages reach the objective
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=ATOL, rtol=0, msg=name)
    # Not vacuous: the group-mean advantages (what "grpo" would give, unscaled) train another gradient.
    group_mean = inputs["rewards"] - inputs["rewards"].view(-1, batches.GROUP_SIZE).mean(1).repeat_interleave(
        batches.GROUP_SIZE
    )
    assert (received - group_mean[:, None] * inputs["completion_mask"]).abs().max() > 1e-2


def test_the_mechanism_holds_inside_every_combination(trained):
    """OTB's gradient second moment is below the group-mean baseline's on this batch, in every combination, and every
    combination logs exactly OTB's metrics: the same estimator code ran."""
    names = ("otb/energy_mean", "otb/baseline_mean", "otb/adv_abs_mean", "otb/grad_second_moment",
             "otb/grad_second_moment_group_mean_baseline")  # fmt: skip
    logged = {method: {name: metrics[name] for name in names} for method, (_, (_, _, metrics), _) in trained.items()}
    for method, values in logged.items():
        assert all(len(v) == 1 for v in values.values()), (method, values)  # once per micro-batch (ECHO's step too)
        moment, group_mean = (
            values["otb/grad_second_moment"][0],
            values["otb/grad_second_moment_group_mean_baseline"][0],
        )
        assert moment < group_mean, (method, moment, group_mean)
        assert values == logged["otb"], method


@pytest.mark.parametrize("method", [m for m in METHODS if m != "otb"])
def test_grpo_estimator_runs_nothing_of_otbs(setup, float_model, method):
    """Default configs select "grpo": the fused head stays TRL's, no energy is recorded, the batch keeps no raw rewards
    requirement, and the advantages are TRL's (B,) tensor itself."""
    tokenizer, _, inputs, root = setup
    trainer = _trainer(method, root / "grpo", tokenizer, float_model)
    assert getattr(trainer.args, "advantage_estimator", "grpo") == "grpo"
    assert trainer.estimator.name == "grpo" and trainer._energy is None
    head = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    assert "_trl_head_forward" not in trainer.__dict__ and "_energy_records" not in trainer.__dict__
    assert not trainer.estimator.needs_raw_rewards and not trainer.estimator.needs_energy
    float_inputs = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    float_inputs.pop("old_per_token_energy")
    forward = head.forward
    advantages = trainer.compute_advantages(float_inputs, float_inputs["old_per_token_logps"],
                                            float_inputs["completion_mask"])  # fmt: skip
    assert advantages is float_inputs["advantages"]
    trainer._forward_logps_and_entropies(trainer.model, float_inputs)
    assert head.forward is forward and "_energy_records" not in trainer.__dict__


def test_otb_estimator_patches_the_head_once(setup, float_model):
    tokenizer, _, _, root = setup
    trainer = _trainer("ctpo", root / "patched", tokenizer, float_model, advantage_estimator="otb")
    assert trainer._energy is not None and trainer._energy.head.forward is trainer._energy.fused_forward
    assert trainer._energy.fused_forward is not trainer._energy.trl_forward


# ------------------------------------------------------------------------------------------------ configs
def test_config_defaults_and_refusals(tmp_path):
    kwargs = cpu_config_kwargs(tmp_path / "out")
    for method in METHODS:
        args = method_config(method, tmp_path / "out")
        expected = "otb" if method == "otb" else "grpo"
        assert getattr(args, "advantage_estimator", "grpo") == expected, method
    with pytest.raises(ValueError, match=r"ECHOConfig: advantage_estimator must be one of \('grpo', 'otb'"):
        ECHOConfig(**kwargs, advantage_estimator="rloo")
    with pytest.raises(ValueError, match=r"ECHOConfig: otb_handle_zero_tail set, but advantage_estimator='grpo' "
                                         r"does not read it: set advantage_estimator='otb'"):  # fmt: skip
        ECHOConfig(**kwargs, otb_handle_zero_tail=True)
    with pytest.raises(ValueError, match="OTBConfig: advantage_estimator must be 'otb'"):
        OTBConfig(**kwargs, advantage_estimator="grpo")
    with pytest.raises(ValueError, match="ECHOConfig: otb_token_positions must be one of"):
        ECHOConfig(**kwargs, advantage_estimator="otb", otb_token_positions="compact")
    assert not (tmp_path / "out").exists()
    args = ECHOConfig(**kwargs, advantage_estimator="otb", otb_token_positions="absolute", otb_handle_zero_tail=False)
    assert (args.otb_token_positions, args.otb_handle_zero_tail) == ("absolute", False)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_dfpo_transforms_refuse_per_token_advantages_naming_the_reason(tmp_path, transform):
    with pytest.raises(ValueError, match=rf"dfpo_transform='{transform}' does not take advantage_estimator='otb': "
                                         r"DFPO's in-group transform makes sum_i A_i s_til_i = 0 with ONE advantage "
                                         r"A_i per sequence.*symmetric_clip"):  # fmt: skip
        DFPOConfig(**cpu_config_kwargs(tmp_path), dfpo_transform=transform, advantage_estimator="otb")
    DFPOConfig(**cpu_config_kwargs(tmp_path), dfpo_transform="symmetric_clip", advantage_estimator="otb")


def test_otb_combination_needs_whole_groups_in_every_micro_batch(tmp_path):
    """CTPO alone batches rows freely; with OTB's estimator the whole-group check applies at construction."""
    from trl_groupopt import CTPOTrainer

    assert not CTPOTrainer.needs_whole_groups(method_config("ctpo", tmp_path, per_device_train_batch_size=6))
    args = method_config("ctpo", tmp_path, per_device_train_batch_size=6, advantage_estimator="otb")
    assert CTPOTrainer.needs_whole_groups(args)
    with pytest.raises(ValueError, match=r"CTPOTrainer needs whole groups in every micro-batch"):
        CTPOTrainer.validate_args(args)


def test_cli_selects_the_estimator_for_any_method():
    """`trl-groupopt train --method ctpo --advantage_estimator otb`: the field is a flag of every method's parser."""
    from trl_groupopt.cli.main import parse

    for method in ("ctpo", "echo", "grpo_fix"):
        _, args, _, _ = parse(method, ["--advantage_estimator", "otb", "--otb_handle_zero_tail", "true"])
        assert (args.advantage_estimator, args.otb_handle_zero_tail) == ("otb", True), method
        assert type(args) is get_method(method).config_class
    _, args, _, _ = parse("ctpo", [])
    assert args.advantage_estimator == "grpo"
    with pytest.raises(SystemExit):  # argparse's choices
        parse("ctpo", ["--advantage_estimator", "nonsense"])
    with pytest.raises(ValueError, match="dfpo_transform='min_replace' does not take advantage_estimator='otb'"):
        parse("dfpo", ["--advantage_estimator", "otb"])


def test_model_card_names_the_estimator(setup, float_model, tmp_path):
    from trl_groupopt.trainer.card import method_knobs, render_model_card

    tokenizer = setup[0]
    for overrides, shown in ((dict(), "grpo"), (dict(advantage_estimator="otb"), "otb")):
        trainer = _trainer("ctpo", tmp_path / shown, tokenizer, float_model, **overrides)
        card = render_model_card(trainer)
        summary = ESTIMATORS[shown].summary
        assert f"Advantages (`advantage_estimator`): `{shown}`, {summary}." in card
        rows = {row["name"]: row["value"] for row in method_knobs(trainer.args)}
        assert rows["advantage_estimator"] == shown


# ------------------------------------------------------------------------------------------------ a third estimator
def _leave_one_out(inputs) -> EstimatorOutput:
    """RLOO: A_i = G_i - mean of the other members' rewards (one advantage per sequence)."""
    rewards, groups = inputs.rewards, inputs.groups()
    others = (groups.rows(rewards, "sum") - rewards) / (groups.size - 1)
    return EstimatorOutput(rewards - others)


def test_a_third_estimator_is_one_registry_entry(setup):
    """Register RLOO: ECHO (whose config lists choices at import, but validates against the registry) trains on it,
    with the raw rewards and whole groups the entry declares, and no other change."""
    tokenizer, model, inputs, root = setup
    register_estimator(AdvantageEstimator(name="rloo", estimate=_leave_one_out, summary="leave-one-out mean",
                                          needs_raw_rewards=True, needs_whole_groups=True))  # fmt: skip
    try:
        trainer = _trainer("echo", root / "rloo", tokenizer, model, advantage_estimator="rloo")
        assert trainer.estimator.name == "rloo" and trainer.whole_groups and trainer._energy is None
        mask = inputs["completion_mask"]
        advantages = trainer.compute_advantages(dict(inputs), inputs["old_per_token_logps"], mask)
        rewards = inputs["rewards"].view(-1, batches.GROUP_SIZE)
        expected = rewards - (rewards.sum(1, keepdim=True) - rewards) / (batches.GROUP_SIZE - 1)
        torch.testing.assert_close(advantages, expected.view(-1), atol=ATOL, rtol=0)
        fields = {f.name for f in dataclasses.fields(trainer.args)}
        assert "advantage_estimator" in fields
    finally:
        ESTIMATORS.unregister("rloo")
    assert "rloo" not in ESTIMATORS
