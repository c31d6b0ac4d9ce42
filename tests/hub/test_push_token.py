"""Issue 38: a run of the base trainer with TRL's plain `GRPOConfig` (the `grpo` method's config) and `hub_token` set
uploads no `training_args.bin` holding the token, neither with a checkpoint push (`hub_strategy="every_save"`) nor
with the final `push_to_hub` (the other methods' pushes: tests/hub/test_push.py)."""

from __future__ import annotations

import pytest
from trl import GRPOConfig

from tests.helpers import cpu_config_kwargs, length_reward, tiny_dataset
from tests.hub.conftest import FAKE_TOKEN
from tests.hub.test_push import TOKEN_SHAPED
from trl_groupopt import GroupOptTrainer
from trl_groupopt.data.offline import load_embedded_policy

pytestmark = pytest.mark.slow


def test_plain_grpo_config_pushes_no_token(hub, tmp_path):
    model, tokenizer = load_embedded_policy()
    args = GRPOConfig(**cpu_config_kwargs(tmp_path / "run", num_generations=2, max_steps=2, push_to_hub=True,
                                          hub_model_id="test-user/grpo-token", hub_token=FAKE_TOKEN,
                                          save_strategy="steps", save_steps=1, hub_strategy="every_save",
                                          hub_always_push=True, disable_tqdm=True))  # fmt: skip
    trainer = GroupOptTrainer(model, length_reward, args=args, train_dataset=tiny_dataset(32),
                              processing_class=tokenizer)  # fmt: skip
    trainer.train()
    trainer._finish_current_push()  # the checkpoint pushes run in the background
    trainer.push_to_hub()
    uploaded = {name: content for name, content in hub.uploaded().items() if name.startswith("test-user/grpo-token/")}
    pickles = [name for name in uploaded if "training_args.bin" in name]
    assert pickles, sorted(uploaded)  # the pickle is among what was scanned
    leaking = sorted(name for name, content in uploaded.items()
                     if FAKE_TOKEN.encode() in content or TOKEN_SHAPED.search(content))  # fmt: skip
    assert not leaking, leaking
    assert trainer.args.hub_token == FAKE_TOKEN
