"""`benchmarks/` has no import cycle, counting every import (module level and inside functions, relative and
absolute), with the package checker of tests/test_architecture.py (which proves on a made-up package that it finds a
function-level cycle)."""

from __future__ import annotations

from tests.environment import REPO_ROOT
from tests.test_architecture import find_cycle, import_graph

BENCHMARKS = REPO_ROOT / "benchmarks"


def test_benchmarks_have_no_import_cycle():
    graph = import_graph(BENCHMARKS)
    assert "benchmarks.common" in graph["benchmarks.stress"] and "benchmarks.report" in graph["benchmarks.overhead"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"
