"""No function in `trl_groupopt/`, `scripts/`, `benchmarks/` or `examples/` is longer than 80 lines (`scripts/check_function_length.py`, run here
in this process), and the checker itself flags what it should."""

from __future__ import annotations

import importlib.util

from tests.environment import REPO_ROOT

_CHECKER_LOCATION = importlib.util.spec_from_file_location(
    "check_function_length", REPO_ROOT / "scripts/check_function_length.py"
)
checker = importlib.util.module_from_spec(_CHECKER_LOCATION)
_CHECKER_LOCATION.loader.exec_module(checker)


def test_no_function_over_80_lines(capsys):
    status = checker.main(
        [str(REPO_ROOT / folder) for folder in ("trl_groupopt", "scripts", "benchmarks", "examples")]
    )
    assert status == 0, capsys.readouterr().out


def test_checker_flags_a_long_function(tmp_path, capsys):
    """Not vacuous: an 81-line method is listed by its qualified name and fails the run; an 80-line function is not."""
    method = ["    def long(self):", *[f"        x{i} = {i}" for i in range(79)], "        return 0"]  # 81 lines
    function = ["def fits():", *[f"    x{i} = {i}" for i in range(78)], "    return 0"]  # 80 lines
    (tmp_path / "code.py").write_text("\n".join(["class A:", *method, "", "", *function, ""]))
    assert checker.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{tmp_path / 'code.py'}:2: A.long has 81 lines (> 80)"]
