"""The training command's options as plain data, so that `--help` and argument errors answer before TRL is imported.

A method's options are the fields of `DemoScriptArguments`, its config class and TRL's `ModelConfig`, turned into
flags by TRL's parser. Reading them needs TRL: its `GRPOConfig` imports transformers' `TrainingArguments` (~6 s of
CPU). So the first call computes them (`trl_groupopt.script.live_options`, every shipped method at once) and caches
them as JSON under ``$TRL_GROUPOPT_CACHE`` (default ``~/.cache/trl-groupopt``), keyed by the installed TRL and
transformers versions and a hash of this package's source: a later `--help` or argument error reads the cache and
imports neither TRL nor torch. Any change to those gives a new key, so a cached description is never stale; a cache
that cannot be written only costs time.

The help lists the method's own knobs first, under the method's one-line summary, then the script's options, then
TRL's `GRPOConfig` groups, TRL's `ModelConfig` and transformers' `TrainingArguments`, each under its heading.

:func:`check_argv` only rejects what TRL's parser would reject too (an unknown option, a bad choice, a value of the
wrong type): a type it does not know is accepted here and left to TRL's parser, which parses the same argv next.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .methods import SHIPPED
from .registry import METHODS, get_method

__all__ = ["OneLineParser", "cache_dir", "help_parser", "method_options", "store_options"]

PACKAGE_DIR = Path(__file__).resolve().parent
#: Group keys in the order the help lists them; ``trl:<title>`` groups (TRL's own headings) come between "script"
#: and "model", in TRL's order.
METHOD_GROUP, SCRIPT_GROUP, MODEL_GROUP, TRANSFORMERS_GROUP = "method", "script", "model", "transformers"
GROUP_TITLES = {
    SCRIPT_GROUP: "script options (data, rewards, the run)",
    MODEL_GROUP: "TRL ModelConfig: model loading, LoRA (PEFT), quantization",
    TRANSFORMERS_GROUP: "transformers TrainingArguments (every Trainer's options)",
}
TRL_GROUP_PREFIX = "trl:"


# ---------------------------------------------------------------------------------------------------- the cache
def cache_dir() -> Path:
    """``$TRL_GROUPOPT_CACHE``, else ``$XDG_CACHE_HOME/trl-groupopt``, else ``~/.cache/trl-groupopt``."""
    if os.environ.get("TRL_GROUPOPT_CACHE"):
        return Path(os.environ["TRL_GROUPOPT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trl-groupopt"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _key() -> str:
    """What the options depend on: TRL's and transformers' versions, and this package's source."""
    digest = hashlib.sha256(f"{_version('trl')} {_version('transformers')}".encode())
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_file(method: str, key: str) -> Path:
    return cache_dir() / "options" / key / f"{method}.json"


def _read(method: str, key: str) -> list[dict[str, Any]] | None:
    try:
        return json.loads(_cache_file(method, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, unreadable or cut short: computed again
        return None


#: Keys whose options stay cached (several checkouts or environments may share one cache).
KEPT_KEYS = 4


def store_options(options: Mapping[str, list[dict[str, Any]]], key: str | None = None) -> None:
    """Write each method's options to the cache (atomically; only the :data:`KEPT_KEYS` newest keys' folders are
    kept). Best effort."""
    key = key or _key()
    folder = cache_dir() / "options" / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for method, described in options.items():
            with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as tmp:
                json.dump(described, tmp)
            os.replace(tmp.name, folder / f"{method}.json")
        others = [path for path in folder.parent.iterdir() if path.name != key]
        for other in sorted(others, key=lambda path: path.stat().st_mtime, reverse=True)[KEPT_KEYS - 1 :]:
            shutil.rmtree(other, ignore_errors=True)
    except OSError:
        pass  # a read-only home: every call computes the options (slower, same answer)


def method_options(method: str) -> list[dict[str, Any]]:
    """`method`'s options, as :func:`trl_groupopt.script.live_options` describes them: from the cache, or computed
    now (this imports TRL) and cached with every other shipped method's. A method registered at run time (or a
    shipped name registered again) is computed every time: the cache key cannot see it."""
    get_method(method)
    shipped = _shipped()
    key = _key() if method in shipped else None
    cached = _read(method, key) if key else None
    if cached is not None:
        return cached
    from .script import live_options  # the TRL half

    if key is None:
        return live_options(method)
    computed = {name: live_options(name) for name in shipped}
    store_options(computed, key)
    return computed[method]


def _shipped() -> list[str]:
    """The names of the shipped methods still registered as shipped."""
    return [spec.name for spec in SHIPPED if METHODS.get(spec.name) is spec]


# ---------------------------------------------------------------------------------------------------- the parser
def string_to_bool(value: str) -> bool:
    """TRL's reading of a boolean flag's value (`trl.scripts._hf_argparser.string_to_bool`)."""
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"Truthy value expected: got {value} but expected one of yes/no, true/false.")


#: The value types TRL's parser uses, by the name `live_options` records; "any" is a type this module does not
#: know, so any value passes here and TRL's parser decides.
VALUE_TYPES: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float, "bool": string_to_bool}


def _accepting_none(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(value: str) -> Any:  # mirrors trl.scripts._hf_argparser._accept_none (trl 1.16.0)
        return None if value.lower() in ("none", "null") else inner(value)

    parse.__name__ = inner.__name__
    return parse


def _value_type(option: Mapping[str, Any]) -> Callable[[str], Any] | None:
    if option["type"] is None:
        return None
    inner = VALUE_TYPES.get(option["type"], str)
    return _accepting_none(inner) if option["accepts_none"] else inner


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line: ``prog: error: message``, with the closest option named for a
    misspelled one; exit status 2."""

    def error(self, message: str) -> NoReturn:
        die(self.prog, message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(unknown_option_message(unknown, self._option_string_actions))
        return parsed


def unknown_option_message(unknown: Sequence[str], known: Iterable[str], what: str = "option") -> str:
    """``unknown option --lerning_rate (did you mean --learning_rate?)``, and where to look."""
    names = [u for u in unknown if u.startswith("-")] or list(unknown)
    close = difflib.get_close_matches(names[0], list(known), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown {what} {' '.join(names)}{hint}; --help lists them"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Defaults after each option (TRL's parser shows them too); descriptions as written."""


def _group_title(key: str, method: str) -> tuple[str, str | None]:
    """(title, description) of a group of the help."""
    if key == METHOD_GROUP:
        spec = get_method(method)
        return f"{method} options: {spec.summary or spec.trainer_name}", f"  {spec.trainer_name}, {spec.paper}"
    if key.startswith(TRL_GROUP_PREFIX):
        return f"TRL GRPOConfig: {key[len(TRL_GROUP_PREFIX) :]}", None
    return GROUP_TITLES[key], None


def _ordered_groups(options: Sequence[Mapping[str, Any]]) -> list[str]:
    trl_groups = list(dict.fromkeys(o["group"] for o in options if o["group"].startswith(TRL_GROUP_PREFIX)))
    return [METHOD_GROUP, SCRIPT_GROUP, *trl_groups, MODEL_GROUP, TRANSFORMERS_GROUP]


def help_parser(
    method: str,
    options: Sequence[Mapping[str, Any]],
    *,
    prog: str,
    defaults: Mapping[str, Any] | None = None,
    script_options: Callable[[argparse._ArgumentGroup], None] | None = None,
    script_description: str | None = None,
) -> OneLineParser:
    """A parser of `method`'s options (see :func:`method_options`) that prints the grouped help and checks argv.

    `defaults` are shown in the help (the layers `trl_groupopt.cli` applies); `script_options` adds the options that
    are no dataclass field (``--config``) to the script group, `script_description` heads it. Parsing with
    :func:`parse_unset` gives None for every option not in argv: the values are TRL's parser's to read."""
    spec = get_method(method)
    parser = OneLineParser(
        prog=prog,
        usage="%(prog)s [--config YAML] [--OPTION VALUE ...]",
        description=textwrap.fill(
            f"Train with {spec.trainer_name} ({spec.paper}). The options by group: the method's own, the script's, "
            "then TRL's GRPOConfig by topic, TRL's ModelConfig and transformers' TrainingArguments.",
            100,
        ),
        formatter_class=_HelpFormatter,
        add_help=False,
    )
    groups = {}
    for key in _ordered_groups(options):
        title, description = _group_title(key, method)
        groups[key] = parser.add_argument_group(title, description)
    if not any(o["group"] == METHOD_GROUP for o in options):
        groups[METHOD_GROUP].description += ": no options of its own (TRL's GRPOConfig options below)"
    groups[SCRIPT_GROUP].description = script_description
    groups[SCRIPT_GROUP].add_argument("-h", "--help", action="help", help="show this help and exit")
    if script_options is not None:
        script_options(groups[SCRIPT_GROUP])
    for option in options:
        kwargs = dict(dest=option["dest"], default=option["default"], help=option["help"])
        if option["store_false"]:
            groups[option["group"]].add_argument(*option["flags"], action="store_false", **kwargs)
        else:
            groups[option["group"]].add_argument(
                *option["flags"],
                type=_value_type(option),
                nargs=option["nargs"],
                const=option["const"],
                choices=option["choices"],
                **kwargs,
            )
    parser.set_defaults(**{dest: str(value) for dest, value in (defaults or {}).items()})  # shown, never parsed
    return parser


def parse_unset(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """argv parsed by `parser` (its errors exit), every option not given None: the shown defaults are text."""
    dests = {action.dest for action in parser._actions if action.dest != argparse.SUPPRESS}
    return parser.parse_args(list(argv), argparse.Namespace(**dict.fromkeys(dests)))


def die(prog: str, message: str, status: int = 2) -> NoReturn:
    """Print ``prog: error: message`` (one line) to stderr and exit."""
    sys.stderr.write(f"{prog}: error: {' '.join(message.split())}\n")
    raise SystemExit(status)
