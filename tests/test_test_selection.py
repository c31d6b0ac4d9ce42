"""The test suite's own helpers are not collected as tests (`tests/selection.py::tested_methods` was collected, and
passed, in every module that imported it, with a `PytestReturnNotNoneWarning` each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import selection
from tests.selection import tested_methods  # imported as the test modules import it


def test_tested_methods_is_not_collected_as_a_test(request):
    """This module imports it: collecting this module, or tests/selection.py, finds no `tested_methods` item."""
    for path in (Path(__file__), Path(selection.__file__)):
        module = pytest.Module.from_parent(request.session, path=path)
        assert "tested_methods" not in [item.name for item in module.collect()], path.name
    assert tested_methods()
