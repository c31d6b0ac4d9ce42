"""`scripts/trl_drift.py OLD NEW`: which TRL code the library mirrors, overrides or imports changed between two TRL
wheels, with what the library uses read from its own source (markers and overrides, by AST).

- On a made-up package and two made-up wheels: each kind of use is found, compared by AST (a comment-only change is
  no change), and sorted into changed / unchanged / defined outside TRL / unresolved, the library's own methods left
  out, the other changed members of the subclassed TRL class listed apart.
- On the real TRL 1.15.0 and 1.16.0 wheels (`slow`: `pip download`s them into the script's cache unless there):
  among the `GRPOTrainer` members the library mirrors or overrides only `__init__` changed, and the other changed
  `GRPOTrainer` methods are exactly the generation ones, as the methods' hashes measured when 1.15 support was added.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "trl_drift.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("trl_drift", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["trl_drift"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


drift = _load_script()

LIBRARY = """
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import helper


class Mixin:
    def __post_init__(self):
        super().__post_init__()


class MyConfig(Mixin, GRPOConfig):
    pass


class MyTrainer(GRPOTrainer):
    def __init__(self):  # mirrors GRPOTrainer.__init__ (trl 9.0): its signature
        super().__init__()

    def _compute_loss(self):
        return 0

    def _step(self):
        return 0

    def train(self):  # transformers' Trainer.train
        return 0

    def own_method(self):
        x = 1  # mirrors TRL's `local_variable` (trl 9.0)
        return x


def shuffled(batch):  # mirrors trl.trainer.utils.shuffle (trl 9.0)
    return batch
"""

TRAINER = """
from transformers import Trainer


class GRPOTrainer(Trainer):
    def __init__(self):
        self.a = {init}

    def _compute_loss(self):
        return 1{comment}

    def _step(self):
        return {step}

    def _generate(self):
        return {generate}
"""


def _wheel(folder: Path, version: str, init: int, step: int, generate: int, comment: str, helper: int) -> Path:
    path = folder / f"trl-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("trl/__init__.py", "")
        archive.writestr("trl/trainer/__init__.py", "")
        archive.writestr("trl/trainer/grpo_trainer.py", TRAINER.format(**locals()))
        config = "from transformers import TrainingArguments\n\n\nclass GRPOConfig(TrainingArguments):\n"
        archive.writestr("trl/trainer/grpo_config.py", config + "    def __post_init__(self):\n        pass\n")
        utils = f"def shuffle(batch):\n    return batch\n\n\ndef helper():\n    return {helper}\n"
        archive.writestr("trl/trainer/utils.py", utils)
    return path


def test_made_up_package_and_wheels(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "trainer.py").write_text(LIBRARY)
    old = _wheel(tmp_path, "9.0.0", init=1, step=1, generate=1, comment="", helper=1)
    new = _wheel(tmp_path, "9.1.0", init=2, step=2, generate=2, comment="  # only a comment", helper=2)
    result = drift.compare(drift.Wheel(old), drift.Wheel(new), drift.library_uses(tmp_path / "pkg"))

    assert sorted(result.names("changed")) == ["GRPOTrainer.__init__", "GRPOTrainer._step"]
    assert sorted(result.names("unchanged")) == [
        "GRPOConfig.__post_init__",  # through the mixin
        "GRPOTrainer._compute_loss",  # a comment is no change
        "trl.trainer.utils.shuffle",
    ]
    assert result.names("outside") == ["GRPOTrainer.train"]  # transformers' Trainer; `own_method` is not listed
    assert result.names("unresolved") == ["GRPOTrainer.local_variable"]
    assert result.others == ["GRPOTrainer._generate"]
    assert result.names("changed", how=("imports",)) == ["trl.trainer.utils.helper"]
    text = drift.format_drift(result, "pkg")
    assert text.startswith("TRL 9.0.0 -> 9.1.0")
    assert "GRPOTrainer._step (trl.trainer.grpo_trainer): +1 -1 lines" in text
    assert "overrides trainer.py:22 (MyTrainer)" in text
    assert "GRPOTrainer.train: transformers.Trainer.train" in text


def test_a_missing_wheel_file_exits_2(tmp_path, capsys):
    assert drift.main([str(tmp_path / "trl-0.0.0-py3-none-any.whl"), "1.16.0", "--wheels", str(tmp_path)]) == 2
    assert "no wheel at" in capsys.readouterr().err


#: From the per-method source hashes of the three wheels (1.14.2, 1.15.0, 1.16.0) taken when 1.15 support was added.
GENERATION_CHANGES = {"GRPOTrainer._generate", "GRPOTrainer._generate_single_turn", "GRPOTrainer._tool_call_loop"}


@pytest.mark.slow
def test_trl_1_15_to_1_16(capsys):
    try:
        wheels = [drift.Wheel(drift.wheel_for(version, drift.DEFAULT_WHEELS)) for version in ("1.15.0", "1.16.0")]
    except SystemExit as error:
        pytest.skip(f"the TRL wheels cannot be had offline here: {error}")
    result = drift.compare(*wheels, drift.library_uses(REPO_ROOT / "trl_groupopt"))
    trainer = {name for name in result.names("changed") if name.startswith("GRPOTrainer.")}
    assert trainer == {"GRPOTrainer.__init__"}
    assert "GRPOTrainer._compute_loss" in result.names("unchanged")
    assert {name for name in result.others if name.startswith("GRPOTrainer.")} == GENERATION_CHANGES
    assert drift.main(["1.15.0", "1.16.0"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("TRL 1.15.0 -> 1.16.0") and "GRPOTrainer.__init__ (trl.trainer.grpo_trainer)" in printed
