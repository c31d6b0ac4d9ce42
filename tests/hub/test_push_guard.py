"""`push_to_hub` with weights that hold NaN or inf raises before anything is uploaded (the non-finite guard,
`trl_groupopt/trainer/guard.py`), against the local Hub server of `tests/hub/server.py`."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import method_trainer
from trl_groupopt.trainer.guard import NonFiniteError


def test_pushing_nonfinite_weights_raises_before_any_upload(hub, tmp_path, tokenizer, base_model):
    repo_id = "test-user/diverged-run"
    trainer = method_trainer("echo", tmp_path, base_model, tokenizer, push_to_hub=True, hub_model_id=repo_id)
    with torch.no_grad():
        original = trainer.model.lm_head.weight.clone()
        trainer.model.lm_head.weight[0, 0] = float("nan")
    try:
        with pytest.raises(NonFiniteError, match="Refusing to save weights that hold NaN or inf"):
            trainer.push_to_hub()
    finally:
        with torch.no_grad():
            trainer.model.lm_head.weight.copy_(original)
    assert not any(path.endswith(".safetensors") for path in hub.uploaded()), sorted(hub.uploaded())
    assert not (tmp_path / "model.safetensors").exists()
    assert not hub.errors, hub.errors
