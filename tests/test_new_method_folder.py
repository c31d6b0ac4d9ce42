"""A method is one folder (issue 44's acceptance): docs/adding-a-method.md's procedure, run on a copy of the repository.

The copy holds this checkout's files (`git ls-files`, untracked ones included) and one more folder: a shipped
method's (`SOURCE`) copied to `trl_groupopt/methods/<NEW>/`, with the old name renamed to the new one inside that
folder only (lower and upper case: registry name, import paths, class names, config-field and metric prefixes). No
other file differs. In the copy, with the copy first on `PYTHONPATH` (checked: its `trl_groupopt` and `tests` are the
ones imported), pytest runs every shared test family of the doc for the new method (`TRL_GROUPOPT_TEST_METHODS=<NEW>`,
`-k <NEW>`), fast and slow; each family must collect tests of the new method, and all must pass (`slow`: one pytest
process over the families' files, a few minutes on 2 cores). The doc's check is fast.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT, process_environment
from tests.selection import ENVIRONMENT_VARIABLE

SOURCE, NEW = "ctpo", "copiedpo"
DOC = REPO_ROOT / "docs" / "adding-a-method.md"
#: The shared test families of docs/adding-a-method.md, and their files.
FAMILIES = {
    "parity": ("tests/trainers/test_dropin.py", "tests/e2e/test_dropin_training.py"),
    "accumulation invariance": ("tests/trainers/test_accumulation_invariance.py",),
    "sharding invariance": ("tests/distributed/test_sharding_invariance.py",),
    "host syncs": ("tests/trainers/test_host_syncs.py",),
    "model card": ("tests/hub/test_model_card.py", "tests/e2e/test_model_card_training.py"),
    "Hub push": ("tests/hub/test_push.py",),
    "run report": ("tests/trainers/test_mechanism_report.py", "tests/e2e/test_run_report.py"),
    "CLI help": ("tests/test_cli_help.py",),
    "compare": ("tests/test_compare.py", "tests/e2e/test_compare.py"),
    "training": ("tests/e2e/test_method_training.py",),
}


def repository_files() -> list[str]:
    """This checkout's files: tracked and untracked, without the ignored ones (build outputs, caches)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    return sorted(name for name in listed if name and (REPO_ROOT / name).is_file())


def rename(text: str) -> str:
    return text.replace(SOURCE, NEW).replace(SOURCE.upper(), NEW.upper())


def copy_with_a_new_method(root: Path) -> Path:
    """The repository under `root`, plus `SOURCE`'s folder copied to `NEW`'s and renamed inside; the new folder."""
    for name in repository_files():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, root / name)
    source, folder = root / "trl_groupopt" / "methods" / SOURCE, root / "trl_groupopt" / "methods" / NEW
    for path in sorted(source.rglob("*.py")):
        target = folder / rename(str(path.relative_to(source)))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rename(path.read_text(encoding="utf-8")), encoding="utf-8")
    return folder


def outcomes(junit: Path) -> dict[str, dict[str, str]]:
    """test file -> {test name: "passed" | "failed" | "error" | "skipped"}, from pytest's JUnit XML."""
    found: dict[str, dict[str, str]] = {}
    for case in ET.parse(junit).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            kinds[0] if kinds else "", "passed"
        )
        found.setdefault(path, {})[case.get("name", "")] = outcome
    return found


def run_shared_families(method: str, cwd: Path, env: dict[str, str], junit: Path, timeout: int) -> str:
    """Every shared test family (`FAMILIES`) for `method` alone, in a process of its own (docs/adding-a-method.md's
    command): each family collects tests of `method` and all pass. Returns the line that says so (counts, wall)."""
    files = [path for paths in FAMILIES.values() for path in paths]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", method,
                           f"--junitxml={junit}", *files], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    wall = time.perf_counter() - started
    assert junit.is_file(), proc.stdout[-4000:] + proc.stderr[-4000:]
    results, counts = outcomes(junit), {}
    for family, paths in FAMILIES.items():
        tests = {f"{path}::{name}": outcome for path in paths for name, outcome in results.get(path, {}).items()}
        assert tests, f"{family}: no test of {method} collected in {paths}"
        assert all(method in name for name in tests), tests
        failed = {name: outcome for name, outcome in tests.items() if outcome != "passed"}
        assert not failed, f"{family}: {failed}\n{proc.stdout[-6000:]}"
        counts[family] = len(tests)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return f"{sum(counts.values())} shared tests passed in {wall:.0f} s: " + ", ".join(
        f"{family} {n}" for family, n in counts.items()
    )


def test_the_doc_is_the_procedure_and_lists_the_files():
    text = DOC.read_text(encoding="utf-8")
    assert "cp -r trl_groupopt/methods/ctpo trl_groupopt/methods/<m>" in text
    assert "s/ctpo/<m>/g; s/CTPO/<M>/g" in text and f"{ENVIRONMENT_VARIABLE}=<m>" in text
    for name in ("__init__", "objective", "trainer", "spec"):
        assert f"`trl_groupopt/methods/<m>/{name}.py`" in text, name
    for family, files in FAMILIES.items():
        assert all(f"`{path}`" in text and path in text.split("```bash")[1] for path in files), family


@pytest.mark.slow  # copies the repository and runs pytest in it
def test_a_copied_method_folder_passes_every_shared_test(tmp_path, capsys):
    copy = tmp_path / "repo"
    folder = copy_with_a_new_method(copy)
    assert sorted(p.name for p in folder.glob("*.py")) == ["__init__.py", "objective.py", "spec.py", "trainer.py"]
    assert f'name="{NEW}"' in (folder / "spec.py").read_text() and SOURCE not in (folder / "trainer.py").read_text()
    changed = [name for name in repository_files() if (copy / name).read_bytes() != (REPO_ROOT / name).read_bytes()]
    assert changed == []  # no other file changed
    env = process_environment(PYTHONPATH=str(copy), **{ENVIRONMENT_VARIABLE: NEW})

    probe = ("import trl_groupopt, tests\nfrom trl_groupopt import METHODS\n"
             f"print('PROBE', trl_groupopt.__file__, tests.__file__, METHODS[{NEW!r}].trainer_class.__module__, sep=chr(9))")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True, timeout=300
    )
    # Only the marked line: an inherited environment may make imports print (a warning, a banner).
    probed = [line.split("\t")[1:] for line in proc.stdout.splitlines() if line.startswith("PROBE\t")]
    assert len(probed) == 1 and len(probed[0]) == 3, proc.stdout + proc.stderr
    package, tests_package, module = probed[0]
    assert Path(package).is_relative_to(copy) and Path(tests_package).is_relative_to(copy), proc.stdout
    assert module == f"trl_groupopt.methods.{NEW}.trainer"

    said = run_shared_families(NEW, copy, env, tmp_path / "junit.xml", timeout=1500)
    with capsys.disabled():
        print(f"\n{NEW} (a copy of {SOURCE}'s folder): {said}")
