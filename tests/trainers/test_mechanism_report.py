"""The trainers' side of the mechanism report, without training: which definitions a trainer reports (its method's,
a mode's, OTB's with OTB advantages), the report before any step, and DFPO's own word in place of TRL's
`'dapo'`-with-sequence-ratios warning (no other TRL warning silenced). Trained runs: tests/e2e/test_run_report.py."""

from __future__ import annotations

import logging

import pytest
from trl import GRPOConfig

from tests.helpers import clone_model, cpu_config_kwargs, length_reward, method_trainer, tiny_dataset
from tests.selection import tested_methods
from trl_groupopt import DFPOConfig, DFPOTrainer, get_method
from trl_groupopt.methods.dfpo.trainer import SUM_LOSS_NOTE, TRL_SEQUENCE_LOSS_ADVICE
from trl_groupopt.methods.otb import spec as otb
from trl_groupopt.trainer.base import GroupOptTrainer

TRL_LOGGER = "trl.trainer.grpo_trainer"


@pytest.mark.parametrize("method", tested_methods())
def test_trainer_reports_its_methods_definition(method, tokenizer, base_model, tmp_path):
    """Each registered method's trainer reports that method's definition; before training, nothing was measured."""
    trainer = method_trainer(method, tmp_path, clone_model(base_model), tokenizer, num_generations=2)
    report = trainer.mechanism_report
    if get_method(method).mechanism is None:  # a method registered without a definition: no report
        assert report is None
        return
    assert [outcome.mechanism for outcome in report.outcomes] == [get_method(method).mechanism]
    assert report.method == method and report.advantage_estimator == trainer.estimator.name
    (outcome,) = report.outcomes
    assert outcome.steps == 0 and "not measured" in outcome.text and not report.never_acted


def test_otb_advantages_add_otbs_definition(tokenizer, base_model, tmp_path):
    """A config whose `advantage_estimator` is "otb" (any method) reports OTB's token baseline too, and says so."""
    trainer = method_trainer("ctpo", tmp_path, clone_model(base_model), tokenizer, num_generations=2,
                             advantage_estimator="otb")  # fmt: skip
    report = trainer.mechanism_report
    assert [outcome.mechanism for outcome in report.outcomes] == [get_method("ctpo").mechanism, otb.METHOD.mechanism]
    assert report.advantage_estimator == "otb"


def test_a_custom_objective_on_the_base_spec_has_no_definition(tokenizer, base_model, tmp_path):
    """A subclass with its own objective that keeps the base's spec is not GRPO: no report rather than GRPO's."""

    class Custom(GroupOptTrainer):
        def objective(self, *args, **kwargs):
            return super().objective(*args, **kwargs)

    args = GRPOConfig(**cpu_config_kwargs(tmp_path, num_generations=2))
    trainer = Custom(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
                     processing_class=tokenizer)  # fmt: skip
    assert trainer.mechanism_report is None


def _messages(caplog, logger: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == logger]


def test_dfpo_replaces_trls_loss_type_advice_with_its_own_line(tokenizer, base_model, tmp_path, caplog):
    """TRL advises loss_type='grpo' for sequence-level ratios with 'dapo'; DFPO (sequence ratios, 'dapo' by default)
    says instead why 'dapo' is kept and what 'grpo' would cost, in one line. Fails without the replacement."""
    args = DFPOConfig(**cpu_config_kwargs(tmp_path, num_generations=2))
    assert (args.importance_sampling_level, args.loss_type) == ("sequence", "dapo")
    with caplog.at_level(logging.WARNING):
        DFPOTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
                    processing_class=tokenizer)  # fmt: skip
    assert not [m for m in _messages(caplog, TRL_LOGGER) if TRL_SEQUENCE_LOSS_ADVICE in m]
    ours = _messages(caplog, "trl_groupopt.methods.dfpo.trainer")
    assert ours == [SUM_LOSS_NOTE.format(args=args)] and "\n" not in ours[0]
    assert "cancel" in ours[0] and "loss_type='grpo'" in ours[0] and "1/|y_i|" in ours[0]
    assert not logging.getLogger(TRL_LOGGER).filters  # the filter is gone once the trainer is built


def test_dfpo_silences_no_other_trl_warning(tokenizer, base_model, tmp_path, caplog):
    """TRL's other warnings pass: DFPO's model_init_kwargs warning; the base trainer's GSPO advice unchanged."""
    args = DFPOConfig(
        **cpu_config_kwargs(tmp_path / "dfpo", num_generations=2, model_init_kwargs={"dtype": "float32"})
    )
    with caplog.at_level(logging.WARNING):
        DFPOTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
                    processing_class=tokenizer)  # fmt: skip
    assert any("model_init_kwargs" in m for m in _messages(caplog, TRL_LOGGER))
    caplog.clear()
    grpo_args = GRPOConfig(**cpu_config_kwargs(tmp_path / "gspo", num_generations=2, loss_type="dapo",
                                               importance_sampling_level="sequence"))  # fmt: skip
    with caplog.at_level(logging.WARNING):
        GroupOptTrainer(clone_model(base_model), length_reward, args=grpo_args, train_dataset=tiny_dataset(8),
                        processing_class=tokenizer)  # fmt: skip
    assert any(TRL_SEQUENCE_LOSS_ADVICE in m for m in _messages(caplog, TRL_LOGGER))
    assert not _messages(caplog, "trl_groupopt.methods.dfpo.trainer")


def test_the_report_callback_is_exportable_state():
    """The callback's state (what `trainer_state.json` holds) rebuilds it with its counts, both ways transformers and
    the callback itself restore it: `from_state` (`restore_callback_states_from_checkpoint=True`) and `on_train_begin`
    of a resumed run; a fresh run (step 0) starts from zero."""
    import json

    from transformers import TrainerControl, TrainerState

    from trl_groupopt.trainer.report import MechanismReportCallback

    callback = MechanismReportCallback("echo", "grpo")
    for clipped in (1.0, 0.0, 1.0):
        callback.tracker.record("echo/batch_clipped", clipped)
        callback.on_step_end(None, None, None)
    saved = json.loads(json.dumps(callback.state()))
    assert callback.pending == [("acted/echo", 1.0), ("acted/echo", 0.0), ("acted/echo", 1.0)]
    rebuilt = MechanismReportCallback.from_state(saved)
    assert rebuilt.report().to_dict() == callback.report().to_dict()
    resumed = MechanismReportCallback("echo", "grpo")
    state = TrainerState(global_step=3, stateful_callbacks={"MechanismReportCallback": saved})
    resumed.on_train_begin(None, state, TrainerControl())
    (outcome,) = resumed.report().outcomes
    assert (outcome.steps, outcome.acted) == (3, 2)
    resumed.on_train_begin(None, TrainerState(global_step=0, stateful_callbacks={"MechanismReportCallback": saved}),
                           TrainerControl())  # fmt: skip
    assert resumed.report().outcomes[0].steps == 0
    other = MechanismReportCallback("ctpo", "grpo")  # another method's saved state is not this run's
    other.on_train_begin(None, state, TrainerControl())
    assert other.report().outcomes[0].steps == 0
