"""The Colab notebook runs end to end in its smoke mode, for every METHOD, offline on CPU.

`TRL_GROUPOPT_SMOKE=1` makes `notebooks/trl_groupopt_colab.ipynb` skip the pip install, the Hub login, the GSM8K and
Qwen downloads and the push, and train the embedded tiny policy (`trl_groupopt.offline.EMBEDDED_POLICY_PATH`) on the
synthetic arithmetic task for 2 steps on CPU, writing only under `TRL_GROUPOPT_OUTPUT_DIR` (default: a new temporary
folder); `TRL_GROUPOPT_METHOD` selects the method (any name in `trl_groupopt.METHODS`). Every other cell (dataset
mapping to conversational prompts, LoRA, the METHOD switch, rewards, config, training, memory stats, reward plot,
model card, inference and accuracy) runs as a Colab user would run it. What smoke mode cannot check: the install
line, `notebook_login`, GSM8K/Qwen downloads and `push_to_hub`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "trl_groupopt_colab.ipynb"
METHODS = ("echo", "dfpo", "ctpo", "otb")

nbformat = pytest.importorskip("nbformat", reason="needs the dev extra: pip install -e '.[dev]' (nbformat)")
nbclient = pytest.importorskip("nbclient", reason="needs the dev extra: pip install -e '.[dev]' (nbclient)")
pytest.importorskip("ipykernel", reason="needs the dev extra: pip install -e '.[dev]' (ipykernel, python3 kernel)")


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


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_notebook_smoke_run(method, tmp_path, monkeypatch):
    """Execute every cell with nbclient (python3 kernel) in smoke mode: trains, plots, writes the card, infers."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("TRL_GROUPOPT_SMOKE", "1")
    monkeypatch.setenv("TRL_GROUPOPT_METHOD", method)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TRL_GROUPOPT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.delenv("HF_TOKEN", raising=False)

    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})  # fmt: skip
    client.execute()

    outputs = "\n".join(
        output.get("text", "") + json.dumps(output.get("data", {}).get("text/plain", ""))
        for cell in nb.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    )  # fmt: skip
    assert f"METHOD = '{method}', smoke mode: True" in outputs
    assert "accuracy before training:" in outputs and "before ->" in outputs
    assert "method metrics logged: [" in outputs and f"'{method}/" in outputs  # the method's own metrics
    run_dir = tmp_path / f"smoke-{method}"
    assert (run_dir / "adapter_model.safetensors").is_file()  # LoRA adapter saved
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    card = (run_dir / "README.md").read_text(encoding="utf-8")
    assert "## Citations" in card and "### Training reward" in card and "| `reward` |" in card
    images = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]  # fmt: skip
    assert images, "the reward plot was not displayed"


def _repo_status() -> list[str]:
    """Every changed, untracked or ignored path under notebooks/ (where the kernel runs) and at the top level
    (bytecode caches aside; other directories are left out: concurrent tests and runs may write there)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored", "--", "notebooks",
                          ":(glob)*"], cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sorted(line for line in out.splitlines() if "__pycache__" not in line and ".pytest_cache" not in line)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("jupyter") is None or not (ROOT / ".git").exists(), reason="needs jupyter and git")
def test_readme_notebook_command_leaves_the_repo_clean(tmp_path):
    """The README's command (`TRL_GROUPOPT_SMOKE=1 jupyter execute notebooks/trl_groupopt_colab.ipynb`, run from the
    repository root) succeeds and writes nothing into the repository, not even an ignored file."""
    env = dict(os.environ, TRL_GROUPOPT_SMOKE="1", TRL_GROUPOPT_METHOD="echo", TMPDIR=str(tmp_path),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    env.pop("TRL_GROUPOPT_OUTPUT_DIR", None)
    before = _repo_status()
    proc = subprocess.run(["jupyter", "execute", "notebooks/trl_groupopt_colab.ipynb"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _repo_status() == before
    assert list(tmp_path.glob("trl_groupopt-smoke-*/smoke-echo/adapter_model.safetensors"))  # went to the temp dir
