"""The train options compare reads or takes out of the words it passes to every run (standard library only).

Secrets: a value that must reach no file (`--hub_token`) leaves the train options here and reaches each run through
its environment only (`HF_TOKEN`, which the Hub client reads): the runs file, compare.json/.md, the commands a run's
log prints and the pickles a Slurm job is submitted with never hold it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

#: train option -> the environment variable its value reaches the runs through
SECRET_OPTIONS = {"hub_token": "HF_TOKEN"}
#: the shortest abbreviation of each that train's parser (argparse's allow_abbrev) reads as the option itself
SECRET_ABBREVIATIONS = {"hub_token": "hub_t"}
#: environment variables that hold a secret: never written (they reach the runs as the driver's environment does)
SECRET_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
_BOOLS = {"true": "true", "t": "true", "yes": "true", "y": "true", "false": "false", "f": "false", "no": "false",
          "n": "false"}  # fmt: skip


def scan(args: Sequence[str], *names: str) -> tuple[dict[str, str | None], list[str]]:
    """The values of the options `names` in `args` (`--a_b V`, `--a-b=V`; the last wins; "" without a value, None
    when absent) and the other args, in order."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in names:
        parser.add_argument(*{f"--{name}", f"--{name.replace('_', '-')}"}, dest=name, nargs="?", const="")
    known, rest = parser.parse_known_args(list(args))
    return vars(known), rest


def _secret(word: str) -> str | None:
    """The secret option `word` (`--hub_token`, `--hub-tok=V`, ...) names, or None."""
    name = word[2:].partition("=")[0].replace("-", "_") if word.startswith("--") else ""
    return next((s for s, shortest in SECRET_ABBREVIATIONS.items() if name.startswith(shortest) and
                 s.startswith(name)), None)  # fmt: skip


def take_secrets(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(`args` without the secret options, written in full or abbreviated, {environment variable: value} to give
    the runs instead)."""
    rest, secrets, words = [], {}, list(args)
    while words:
        word = words.pop(0)
        name = _secret(word)
        if name is not None and "=" not in word and words and not words[0].startswith("--"):
            word += "=" + words.pop(0)
        if name is None or not word.partition("=")[2]:
            rest.append(word)  # no value: train's parser says so
            continue
        secrets[SECRET_OPTIONS[name]] = word.partition("=")[2]
    return rest, secrets


def secret_values(secrets: dict[str, str]) -> list[str]:
    """The values no file may hold: `secrets` and those of the secret environment variables here."""
    values = [*secrets.values(), *(os.environ.get(name) for name in SECRET_VARIABLES)]
    return [v for v in values if v and len(v) >= 8]


def _normal(value: str) -> str:
    """One spelling of a value: a boolean's, a float's, a file's or folder's resolved path."""
    if value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    try:
        if any(c in value for c in ".eE") and float(value) == float(value):
            return repr(float(value))
    except ValueError:
        pass
    path = Path(value).expanduser()
    if any(c in value for c in "/.~" + os.sep) and path.exists():
        return str(path.resolve())
    return value


def train_options(args: Sequence[str]) -> dict[str, str | list[str]]:
    """The train options as name -> value, as train's parser reads them: `--a-b=V` as `--a_b V`, in any order, the
    last one given wins, a bare flag is "true"; values normalised by `_normal` (the same file by another path is
    the same value); several values (`--reward_weights 1 2`) a list."""
    found: dict[str, list[str]] = {}
    values: list[str] = found.setdefault("", [])  # words before the first option
    for word in args:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            found[name.replace("-", "_")] = values = [value] if eq else []
        else:
            values.append(word)
    out: dict[str, str | list[str]] = {}
    for name, given in found.items():
        if name or given:
            normal = [_normal(v) for v in given] or ["true"]
            out[name] = normal[0] if len(normal) == 1 else normal
    return out


@contextmanager
def secrets_in_environment(secrets: Mapping[str, str]) -> Iterator[None]:
    """`secrets` in this process's environment for the block, which a job started in it (a submitit controller,
    `sbatch`) copies: never in a pickle, a script or an argument. The environment is restored after."""
    saved = {name: os.environ.get(name) for name in secrets}
    os.environ.update(secrets)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
