"""OTBTrainer end to end: 2 steps with the environment's reward as the only reward and a tool-use `rollout_func`
(the environment, rollout and one-step checks: tests/trainers/test_otb_trainer.py)."""

from __future__ import annotations

from tests.helpers import tiny_model
from tests.trainers.test_otb_trainer import _env_trainer, make_tool_tokenizer


def test_environment_reward_only_trains_two_steps(tmp_path):
    tool_tokenizer = make_tool_tokenizer()
    trainer = _env_trainer(tmp_path, "train", tiny_model(tool_tokenizer), tool_tokenizer, max_steps=2)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "otb/energy_mean" in entry]
    assert len(logged) == 2 and all(entry["otb/energy_mean"] > 0 for entry in logged)
    assert "rewards/ScoredEnv/mean" in logged[0]  # logged at generation steps (one per 2 steps here)
