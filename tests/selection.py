"""Which registered methods the registry-parametrised tests run: every method of `trl_groupopt.METHODS`, or only those
named in the environment variable `TRL_GROUPOPT_TEST_METHODS` (comma-separated registry names). The variable selects,
it changes no test: `tests/test_new_method_folder.py` sets it to run every shared test for one new method only, and
the workers that tests launch inherit it (`tests.environment.process_environment`). TRL-free."""

from __future__ import annotations

import os

ENVIRONMENT_VARIABLE = "TRL_GROUPOPT_TEST_METHODS"


def tested_methods() -> list[str]:
    """The registry names the shared tests run, in registration order; an unknown name is an error naming the
    registered ones."""
    from trl_groupopt.methods.registry import METHODS

    wanted = [name.strip() for name in os.environ.get(ENVIRONMENT_VARIABLE, "").split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(METHODS))
    if unknown:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE} names {unknown}, not registered methods; registered: {list(METHODS)}"
        )
    return [name for name in METHODS if not wanted or name in wanted]


tested_methods.__test__ = False  # its name starts with "test": without this pytest collects it wherever imported
