"""The Colab notebook runs end to end in its smoke mode, for every METHOD, offline on CPU.

`TRL_GROUPOPT_SMOKE=1` makes `notebooks/trl_groupopt_colab.ipynb` skip the pip install, the Hub login, the GSM8K and
Qwen downloads and the push, and train the embedded tiny policy (`trl_groupopt.data.offline.EMBEDDED_POLICY_PATH`) on the
synthetic arithmetic task for 2 steps on CPU, writing only under `TRL_GROUPOPT_OUTPUT_DIR` (default: a new temporary
folder); `TRL_GROUPOPT_METHOD` selects the method (any name in `trl_groupopt.METHODS`). Every other cell (dataset
mapping to conversational prompts, LoRA, the METHOD switch, rewards, config, training, memory stats, reward plot,
model card, inference and accuracy) runs as a Colab user would run it. What smoke mode cannot check: the install
line, `notebook_login`, GSM8K/Qwen downloads and `push_to_hub`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.environment import REPO_ROOT as ROOT
from tests.environment import process_environment
from tests.test_notebook_structure import METHODS, NOTEBOOK

nbformat = pytest.importorskip("nbformat", reason="needs the dev extra: pip install -e '.[dev]' (nbformat)")
nbclient = pytest.importorskip("nbclient", reason="needs the dev extra: pip install -e '.[dev]' (nbclient)")
pytest.importorskip("ipykernel", reason="needs the dev extra: pip install -e '.[dev]' (ipykernel, python3 kernel)")


@pytest.mark.parametrize("method", METHODS)
def test_notebook_smoke_run(method, tmp_path, monkeypatch):
    """Execute every cell with nbclient (python3 kernel) in smoke mode: trains, plots, writes the card, infers."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("TRL_GROUPOPT_SMOKE", "1")
    monkeypatch.setenv("TRL_GROUPOPT_METHOD", method)
    for name, value in process_environment().items():  # the kernel inherits this process's environment
        monkeypatch.setenv(name, value)
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
    assert "held-out accuracy: " in outputs and " after training (8 prompts)" in outputs  # smoke mode: readable
    assert "optimizer steps" in outputs and "Advantage estimator: " in outputs  # the mechanism report
    assert "method metrics logged: [" in outputs and f"'{method}/" in outputs  # the method's own metrics
    run_dir = tmp_path / f"smoke-{method}"
    assert (run_dir / "adapter_model.safetensors").is_file()  # LoRA adapter saved
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    card = (run_dir / "README.md").read_text(encoding="utf-8")
    assert "## Citations" in card and "### Training reward" in card and "| `reward` |" in card
    assert (
        "Held-out greedy-decoding accuracy (8 prompts): **" in card and "### Did the method's mechanism act?" in card
    )
    images = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]  # fmt: skip
    assert images, "the reward plot was not displayed"


def _repo_status() -> list[str]:
    """Every changed, untracked or ignored path under notebooks/ (where the kernel runs) and at the top level
    (bytecode caches aside; other directories are left out: concurrent tests and runs may write there)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored", "--", "notebooks",
                          ":(glob)*"], cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sorted(line for line in out.splitlines() if "__pycache__" not in line and ".pytest_cache" not in line)


@pytest.mark.skipif(shutil.which("jupyter") is None or not (ROOT / ".git").exists(), reason="needs jupyter and git")
def test_readme_notebook_command_leaves_the_repo_clean(tmp_path):
    """The README's command (`TRL_GROUPOPT_SMOKE=1 jupyter execute notebooks/trl_groupopt_colab.ipynb`, run from the
    repository root) succeeds, writes nothing into the repository, not even an ignored file, prints the method and
    the held-out accuracy on the terminal and leaves no `trl_groupopt-smoke-*` folder in the temporary directory
    (issue 38: it printed nothing a user could read and left an 820 KB folder behind each time)."""
    env = process_environment(TRL_GROUPOPT_SMOKE="1", TRL_GROUPOPT_METHOD="echo", TMPDIR=str(tmp_path),
                              PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    env.pop("TRL_GROUPOPT_OUTPUT_DIR", None)
    before = _repo_status()
    proc = subprocess.run(["jupyter", "execute", "notebooks/trl_groupopt_colab.ipynb"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _repo_status() == before
    printed = proc.stdout + proc.stderr
    assert "METHOD = 'echo', smoke mode: True" in printed
    assert re.search(r"held-out accuracy: [\d.]+% before -> [\d.]+% after training \(8 prompts\)", printed), printed
    removed = re.search(r"smoke run done: echo trained 2 steps; removed (\S+)", printed)
    assert removed and removed.group(1).startswith(str(tmp_path / "trl_groupopt-smoke-")), printed  # the temp dir
    assert not list(tmp_path.glob("trl_groupopt-smoke-*"))
