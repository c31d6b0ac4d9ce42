"""The class-level data a method trainer sets instead of overriding more than `objective` (issue 36): a config-
dependent `requires_whole_groups` (a trainer with modes, as DFPO with GRPO-fix) and `replaces_trl_warning` (TRL's
construction warning that would mislead the method's users, and the line logged in its place)."""

from __future__ import annotations

import logging

from trl import GRPOConfig

from tests.helpers import clone_model, cpu_config_kwargs, length_reward, tiny_dataset
from trl_groupopt.trainer.base import GroupOptTrainer

TRL_LOGGER = "trl.trainer.grpo_trainer"
#: The opening words of TRL 1.16's advice for sequence-level ratios with a token-sum loss type.
TRL_ADVICE = "When using `importance_sampling_level='sequence'`, the `'"


class Modal(GroupOptTrainer):
    """Whole groups only in one mode (here: token-sum aggregation); TRL's sequence-ratio advice replaced."""

    requires_whole_groups = staticmethod(lambda args: args.loss_type == "dapo")
    replaces_trl_warning = (TRL_ADVICE, "Modal keeps loss_type={args.loss_type!r} on purpose.")

    def objective(self, *args, **kwargs):
        return super().objective(*args, **kwargs)


def test_requires_whole_groups_may_depend_on_the_config(tmp_path):
    assert Modal.needs_whole_groups(GRPOConfig(**cpu_config_kwargs(tmp_path, loss_type="dapo")))
    assert not Modal.needs_whole_groups(GRPOConfig(**cpu_config_kwargs(tmp_path, loss_type="grpo")))
    assert not GroupOptTrainer.needs_whole_groups(GRPOConfig(**cpu_config_kwargs(tmp_path, loss_type="dapo")))


def test_a_replaced_trl_warning_is_one_line_of_ours(tokenizer, base_model, tmp_path, caplog):
    args = GRPOConfig(**cpu_config_kwargs(tmp_path, num_generations=2, loss_type="dapo",
                                          importance_sampling_level="sequence"))  # fmt: skip
    with caplog.at_level(logging.WARNING):
        Modal(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
              processing_class=tokenizer)  # fmt: skip
    messages = {record.name: [] for record in caplog.records}
    for record in caplog.records:
        messages[record.name].append(record.getMessage())
    assert not [m for m in messages.get(TRL_LOGGER, []) if TRL_ADVICE in m]
    assert messages[__name__] == ["Modal keeps loss_type='dapo' on purpose."]
    assert not logging.getLogger(TRL_LOGGER).filters
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the base trainer replaces nothing: TRL's advice passes
        GroupOptTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
                        processing_class=tokenizer)  # fmt: skip
    assert any(TRL_ADVICE in record.getMessage() for record in caplog.records if record.name == TRL_LOGGER)
