"""The Colab notebook as committed: its conventions and the real-run path (no kernel; the smoke runs that execute it
are in tests/e2e/test_notebooks.py)."""

from __future__ import annotations

import re

import pytest

from tests.environment import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "trl_groupopt_colab.ipynb"
METHODS = ("echo", "dfpo", "ctpo", "otb")

nbformat = pytest.importorskip("nbformat", reason="needs the dev extra: pip install -e '.[dev]' (nbformat)")


def _source(nb) -> str:
    return "\n".join(cell.source for cell in nb.cells)


def test_notebook_structure():
    """The Colab conventions (TRL's GRPO LoRA notebook) and the real-run path are present."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    text = _source(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert "colab.research.google.com/assets/colab-badge.svg" in nb.cells[0].source
    assert "## Key ideas" in text and "| Component | Size |" in text  # key ideas, memory table
    assert "!pip install" in text and "notebook_login()" in text and "trainer.push_to_hub(" in text
    assert 'load_dataset(dataset_name, "main")' in text and "adapters.gsm8k_to_conversational" in text
    assert '"Qwen/Qwen2.5-0.5B-Instruct"' in text and "LoraConfig(" in text and "peft_config=peft_config" in text
    assert "from trl_groupopt.rewards import accuracy_reward, format_reward" in text
    assert "get_method(METHOD)" in text and "from trl_groupopt import METHODS" in text  # the switch reads the registry
    for method in METHODS:
        assert f'"{method}": dict(' in text, method  # each method's knobs shown
    assert 'marker="o"' in text  # a 2-step smoke run still draws visible points
    assert "import matplotlib.pyplot as plt" in text and "trainer.state.log_history" in text
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")  # committed clean
    (login,) = [cell.source for cell in nb.cells if cell.source.startswith("### Log in to Hugging Face")]
    assert "**write** access" in login and "`read` token cannot push" in login
    assert "trainer.heldout_accuracy = " in text and "print(trainer.mechanism_report)" in text
    # the README's test command, with the time it took (measured, not guessed)
    assert re.search(r"`python -m pytest -q tests` took \d+ min \d+ s on a shared 2-core", text)
