"""The train options compare reads or takes out of the words it passes to every run (standard library only).

Secrets: a value that must reach no file (`--hub_token`) leaves the train options here and reaches each run through
its environment only (`HF_TOKEN`, which the Hub client reads): the runs file, compare.json/.md, the commands a run's
log prints and the pickles a Slurm job is submitted with never hold it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

#: train option -> the environment variable its value reaches the runs through
SECRET_OPTIONS = {"hub_token": "HF_TOKEN"}
#: environment variables that hold a secret: never written (they reach the runs as the driver's environment does)
SECRET_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")


def scan(args: Sequence[str], *names: str) -> tuple[dict[str, str | None], list[str]]:
    """The values of the options `names` in `args` (`--a_b V`, `--a-b=V`; the last wins; "" without a value, None
    when absent) and the other args, in order."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in names:
        parser.add_argument(*{f"--{name}", f"--{name.replace('_', '-')}"}, dest=name, nargs="?", const="")
    known, rest = parser.parse_known_args(list(args))
    return vars(known), rest


def take_secrets(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(`args` without the secret options, {environment variable: value} to give the runs instead)."""
    given, rest = scan(args, *SECRET_OPTIONS)
    return rest, {SECRET_OPTIONS[name]: value for name, value in given.items() if value}
