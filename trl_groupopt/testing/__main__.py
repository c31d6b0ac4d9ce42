"""``python -m trl_groupopt.testing [--import MODULE]... [NAME]...``: the contract from the command line (seconds, no
model): each NAME's objective (a registered method) and estimator (a registered advantage estimator), by default
every registered one; ``--import`` (repeatable) first imports a module that registers yours. Exit status 1 when any
fails, each failure printed with the properties it fails."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..core.estimators import ESTIMATORS
from ..methods.registry import METHODS, load_estimators
from .estimator import check_estimator
from .objective import check_objective


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_groupopt.testing", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="registered methods and estimators (default: every one)")
    parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (it registers your method or estimator); repeatable")  # fmt: skip
    args = parser.parse_args(argv)
    for module in args.modules:
        importlib.import_module(module)
    load_estimators()
    unknown = [name for name in args.names if name not in METHODS and name not in ESTIMATORS]
    if unknown:
        parser.error(f"not a registered method or estimator: {', '.join(unknown)} (registered methods: "
                     f"{', '.join(METHODS)}; estimators: {', '.join(ESTIMATORS)}; --import the module that "
                     "registers yours)")  # fmt: skip
    checks = [("objective", name, check_objective) for name in METHODS if not args.names or name in args.names]
    checks += [("estimator", name, check_estimator) for name in ESTIMATORS if not args.names or name in args.names]
    failed = 0
    for kind, name, check in checks:
        try:
            check(name)
        except AssertionError as error:
            failed += 1
            print(f"FAIL {kind} {name}: {error}")
        else:
            print(f"ok   {kind} {name}")
    print(f"{len(checks) - failed} of {len(checks)} pass the contract")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
