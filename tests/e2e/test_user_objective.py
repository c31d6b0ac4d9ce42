"""A method in one function, end to end (issue 50's acceptance): the user's module `tests/user_objective/sapo_like.py`,
copied into a folder outside this repository, trains 2 steps from the command line with `--import`, runs a 2-method
`compare` (which hands the import on to every run), and trains without `--import` once pip has installed it as a
package declaring it in the entry-point group `trl_groupopt.methods`; a user's estimator with a knob trains with a
shipped objective; and the user's objective collects and passes every shared test family of
docs/adding-a-method.md."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT, process_environment
from tests.selection import ENVIRONMENT_VARIABLE
from tests.test_new_method_folder import run_shared_families
from trl_groupopt.methods.registry import ENTRY_POINT_GROUP

USER_MODULE = REPO_ROOT / "tests" / "user_objective" / "sapo_like.py"
TINY = ["--max_steps", "2", "--num_eval_examples", "8", "--heldout_eval_steps", "0"]
ESTIMATOR = """
from trl_groupopt import register_estimator


@register_estimator("rank_toy", knobs={"rank_toy_scale": 1.0}, summary="centred rank of the reward in its group")
def rank_toy(rewards, groups, *, rank_toy_scale):
    ranks = groups.dense(rewards).argsort(-1).argsort(-1).float()  # (K, G)
    return rank_toy_scale * (ranks - ranks.mean(-1, keepdim=True)).reshape(-1)  # (B,)
"""


def _trl_groupopt(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """`python -m trl_groupopt.cli ARGV` in `cwd` (which `python -m` puts on the path, as the user's shell would)."""
    return subprocess.run([sys.executable, "-m", "trl_groupopt.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=process_environment(**env))  # fmt: skip


def _user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    shutil.copy(USER_MODULE, folder / "sapo_like.py")
    return folder


def _trained(output_dir: Path, method: str, cwd: Path, fields: tuple[str, ...] = (), modules: tuple[str, ...] = (),
             **env: str) -> list[str]:  # fmt: skip
    """The run trained 2 steps of `method`; (config class name, `fields`' values) read from its pickled config by a
    process in `cwd` that imports the user's `modules` (the generated classes exist where the objective registers)."""
    results = json.loads((output_dir / "results.json").read_text())
    assert results["method"] == method and results["steps"] == 2, results
    read = (f"import importlib, torch; [importlib.import_module(m) for m in {list(modules)!r}]; "
            f"a = torch.load({str(output_dir / 'training_args.bin')!r}, weights_only=False); "
            f"print(type(a).__name__, *[getattr(a, f) for f in {list(fields)!r}])")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", read], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=process_environment(**env))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_train_two_steps_with_import(tmp_path):
    folder = _user_folder(tmp_path)
    proc = _trl_groupopt(folder, "train", "--method", "sapo_like", "--import", "sapo_like", "--tau_neg", "2",
                         "--output_dir", str(tmp_path / "run"), *TINY)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _trained(tmp_path / "run", "sapo_like", folder, ("tau_neg",), ("sapo_like",)) == [
        "SAPOLikeConfig",
        "2.0",
    ]
    assert "sapo_like" in (tmp_path / "run" / "README.md").read_text()  # the card's tag
    without = _trl_groupopt(folder, "train", "--method", "sapo_like", "--output_dir", str(tmp_path / "no"), *TINY)
    assert without.returncode == 2 and "invalid choice: 'sapo_like'" in without.stderr  # the import is what adds it


def test_compare_with_import_hands_it_to_every_run(tmp_path):
    folder, out = _user_folder(tmp_path), tmp_path / "cmp"
    proc = _trl_groupopt(folder, "compare", "--methods", "grpo,sapo_like", "--import", "sapo_like", "--seeds", "2",
                         "--max_steps", "2", "--eval_examples", "8", "--output_dir", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "compare.json").read_text())
    runs = sorted((r["method"], r["seed"], r["steps"]) for r in result["runs"] if "error" not in r)
    assert runs == [("grpo", 0, 2), ("grpo", 1, 2), ("sapo_like", 0, 2), ("sapo_like", 1, 2)]
    (row,) = result["comparisons"]
    assert (row["method"], row["baseline"], row["n"]) == ("sapo_like", "grpo", 2)
    assert "| sapo_like | grpo | 2 |" in (out / "compare.md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="pip builds the package with setuptools")
def test_an_installed_package_registers_through_its_entry_point(tmp_path):
    """pip installs a one-module project (`pip install --no-deps --no-build-isolation --target SITE`, offline) whose
    pyproject declares the module in the entry-point group; with SITE on the path, train finds the method alone."""
    project = _user_folder(tmp_path)
    (project / "pyproject.toml").write_text(f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sapo-like-plugin"
version = "0.1"

[tool.setuptools]
py-modules = ["sapo_like"]

[project.entry-points."{ENTRY_POINT_GROUP}"]
sapo_like = "sapo_like"
""")
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--target", str(site), str(project)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    shutil.rmtree(project)  # only the installed copy is left
    elsewhere.mkdir()
    proc = _trl_groupopt(elsewhere, "train", "--method", "sapo_like", "--output_dir", str(tmp_path / "run"), *TINY,
                         PYTHONPATH=f"{REPO_ROOT}:{site}")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _trained(tmp_path / "run", "sapo_like", elsewhere, PYTHONPATH=f"{REPO_ROOT}:{site}") == ["SAPOLikeConfig"]


def test_a_function_estimator_with_a_knob_trains_with_a_shipped_objective(tmp_path):
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "rank_toy.py").write_text(ESTIMATOR)
    proc = _trl_groupopt(folder, "train", "--method", "ctpo", "--import", "rank_toy", "--advantage_estimator",
                         "rank_toy", "--rank_toy_scale", "0.5", "--output_dir", str(tmp_path / "run"), *TINY)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fields = ("advantage_estimator", "rank_toy_scale")
    assert _trained(tmp_path / "run", "ctpo", folder, fields, ("rank_toy",)) == [
        "CTPOConfig",
        "rank_toy",
        "0.5",
    ]


def test_the_user_objective_passes_every_shared_test(tmp_path, capsys):
    """docs/adding-a-method.md's command, for the method a module outside the package registers (found through its
    entry point: every process the tests launch finds it too): each family collects tests of it, all pass."""
    site = tmp_path / "site"
    info = site / "sapo_like_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    shutil.copy(USER_MODULE, site / "sapo_like.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sapo-like-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nsapo_like = sapo_like\n")
    env = process_environment(PYTHONPATH=f"{REPO_ROOT}:{site}", **{ENVIRONMENT_VARIABLE: "sapo_like"})
    said = run_shared_families("sapo_like", REPO_ROOT, env, tmp_path / "junit.xml", timeout=1800)
    with capsys.disabled():
        print(f"\nsapo_like (one function, registered through an entry point): {said}")
