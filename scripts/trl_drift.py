"""Which TRL code the library mirrors, overrides or imports changed between two TRL releases: an upgrade's to-do list.

    python scripts/trl_drift.py 1.15.0 1.16.0              # versions: wheels from --wheels DIR, else `pip download`
    python scripts/trl_drift.py old/trl-X.whl new/trl-Y.whl

What the library depends on is read from its source (`--package`, default `trl_groupopt/`), never listed here: every
`# mirrors <name> (trl X)` comment (`GRPOTrainer.<method>`, `trl.<module>.<name>`, or TRL's `<member>` in backticks);
every member defined by a class deriving a TRL class, directly or through the package's own classes and mixins (by
AST, wherever they live); and the names imported from TRL's modules other than `trl` itself (`scripts/trl_uses.py`). Each is looked up in
both wheels (a class member along the class's bases) and compared by AST: comments and layout do not count. Members
that TRL's classes inherit from transformers or the standard library are listed apart (the wheels cannot tell), and
so are the other changed members of the TRL classes the library subclasses. Exit status 0, or 2 without a wheel.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import importlib.util
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path (its test)
from trl_uses import Use, base_names, bound_names, library_uses, origins  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WHEELS = Path.home() / ".cache" / "trl-groupopt" / "wheels"


# ---------------------------------------------------------------------------------------- the wheels' side
class Wheel:
    """The `trl/` sources of one wheel ("trl.trainer.utils" -> source), parsed on demand."""

    def __init__(self, path: Path):
        self.path, self.sources, self.packages = path, {}, set()  # packages: the modules that are an `__init__.py`
        with zipfile.ZipFile(path) as archive:
            for name in (n for n in archive.namelist() if n.startswith("trl/") and n.endswith(".py")):
                module = name[:-3].removesuffix("/__init__").replace("/", ".")
                self.sources[module] = archive.read(name).decode("utf-8")
                self.packages |= {module} if name.endswith("/__init__.py") else set()

    @functools.cache  # noqa: B019 (a few Wheels per run)
    def tree(self, module: str) -> ast.Module:
        return ast.parse(self.sources[module])

    @functools.cache  # noqa: B019
    def find_class(self, name: str) -> tuple[str, ast.ClassDef] | None:
        """The module and definition of TRL class `name` (outside `trl.experimental` first)."""
        pattern = re.compile(rf"^class {name}\b", re.M)
        modules = sorted(
            (m for m, s in self.sources.items() if pattern.search(s)), key=lambda m: ("experimental" in m, m)
        )
        for module in modules:
            for node in self.tree(module).body:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return module, node
        return None


def _member(body: list[ast.stmt], name: str) -> ast.stmt | None:
    return next((stmt for stmt in body if name in bound_names(stmt)), None)


@dataclass(frozen=True)
class Found:
    """Where a name lives in one wheel: `node` and its source, or `outside` (a base class outside TRL)."""

    where: str = ""  # "GRPOTrainer.__init__ in trl.trainer.grpo_trainer"
    node: ast.stmt | None = None  # a def, class or assignment
    source: str = ""
    outside: str | None = None  # "Trainer" when the member is defined (or would be) in a non-TRL base


def _resolve_member(wheel: Wheel, class_name: str, member: str, seen: frozenset = frozenset()) -> Found | None:
    """`class_name.member` along the class's bases in the wheel; else the first base outside TRL, as `outside`."""
    located = wheel.find_class(class_name)
    if located is None:
        return Found(outside=class_name)
    module, cls = located
    stmt = _member(cls.body, member)
    if stmt is not None:
        return Found(f"{class_name}.{member} in {module}", stmt, ast.get_source_segment(wheel.sources[module], stmt))
    outside = None
    for base in base_names(cls):
        if base not in seen:
            found = _resolve_member(wheel, base, member, seen | {class_name})
            if found is not None and found.outside is None:
                return found
            if found is not None and outside is None:
                outside = origins(wheel.tree(module)).get(found.outside, found.outside)
    return Found(outside=outside) if outside else None


def _resolve_module_name(wheel: Wheel, module: str, name: str, depth: int = 0) -> Found | None:
    stmt = _member(wheel.tree(module).body, name)
    if isinstance(stmt, ast.ImportFrom) and module in wheel.packages and depth < 3:  # a package's re-export
        alias = next(a for a in stmt.names if (a.asname or a.name) == name)
        base = ".".join(module.split(".")[: len(module.split(".")) - stmt.level + 1]) if stmt.level else ""
        origin = ".".join(part for part in (base, stmt.module or "") if part)
        if origin in wheel.sources:
            return _resolve_module_name(wheel, origin, alias.name, depth + 1)
    if stmt is None:
        return None
    return Found(f"{name} in {module}", stmt, ast.get_source_segment(wheel.sources[module], stmt))


def resolve(wheel: Wheel, target: str) -> Found | None:
    """`target` ("Class.member", "trl.module.name", "trl.module.Class.member") in `wheel`; None where absent."""
    parts = target.split(".")
    if parts[0] != "trl":
        return _resolve_member(wheel, parts[0], parts[1]) if len(parts) == 2 else None
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if module in wheel.sources:
            rest = parts[cut:]
            if len(rest) == 1:
                return _resolve_module_name(wheel, module, rest[0])
            return _resolve_member(wheel, rest[0], rest[1]) if len(rest) == 2 else None
    return None


# ---------------------------------------------------------------------------------------- the comparison
def _line_counts(old: Found | None, new: Found | None) -> str:
    lines = [(f.source if f is not None and f.node is not None else "").splitlines() for f in (old, new)]
    diff = list(difflib.unified_diff(*lines, lineterm="", n=0))[2:]
    return f"+{sum(line[0] == '+' for line in diff)} -{sum(line[0] == '-' for line in diff)} lines"


class Outside:
    """Members of the classes outside TRL that TRL's classes derive from: read from the installed transformers'
    top-level modules (by AST: importing transformers costs seconds), and from the standard library (imported)."""

    def __init__(self):
        spec = importlib.util.find_spec("transformers")
        root = Path(spec.origin).parent if spec is not None and spec.origin else None
        self.files = sorted(root.glob("*.py")) if root is not None else []

    @functools.cache  # noqa: B019 (one Outside per run)
    def _class(self, name: str) -> tuple[ast.Module, ast.ClassDef] | None:
        pattern = re.compile(rf"^class {name}\b", re.M)
        for path in self.files:
            source = path.read_text(encoding="utf-8")
            if pattern.search(source):
                tree = ast.parse(source)
                return tree, next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        return None

    def owner(self, origin: str, member: str, seen: frozenset = frozenset()) -> str | None:
        """ "transformers.Trainer" (or "argparse.ArgumentParser"): the class `origin` ("module.Name", or a bare
        transformers class name), or one it derives, that defines `member`; None where none does."""
        module, _, name = origin.rpartition(".")
        if module.split(".")[0] in sys.stdlib_module_names:
            return origin if hasattr(getattr(importlib.import_module(module), name, None), member) else None
        located = self._class(name) if module.split(".")[0] in ("", "transformers") else None
        if located is None:
            return None
        tree, cls = located
        if _member(cls.body, member) is not None:
            return f"transformers.{name}"
        imported = origins(tree)
        for base in base_names(cls):
            found = None if base in seen else self.owner(imported.get(base, base), member, seen | {name})
            if found is not None:
                return found
        return None


@dataclass
class Entry:
    """One TRL name the library depends on, as found in each wheel (`owner`: the non-TRL class defining it)."""

    target: str
    uses: list[Use]
    old: Found | None
    new: Found | None
    owner: str | None = None

    @property
    def status(self) -> str:
        """ "changed", "unchanged", "outside" (a class outside TRL defines it) or "unresolved" (nothing does)."""
        nodes = [f.node if f is not None else None for f in (self.old, self.new)]
        if nodes != [None, None]:
            return "unchanged" if None not in nodes and ast.dump(nodes[0]) == ast.dump(nodes[1]) else "changed"
        return "outside" if self.owner else "unresolved"

    @property
    def name(self) -> str:
        where = next((f.where for f in (self.new, self.old) if f is not None and f.where), "")
        return where.replace(" in ", " (") + ")" if where else self.target


@dataclass
class Drift:
    entries: list[Entry]
    others: list[str]  # changed members of the subclassed TRL classes that the library does not touch
    old: Path
    new: Path

    def names(self, status: str, how: tuple[str, ...] = ("mirrors", "overrides")) -> list[str]:
        """The targets with `status` among those the library uses `how` (mirrored or overridden by default)."""
        return [e.target for e in self.entries if e.status == status and any(u.how in how for u in e.uses)]


def _entry(old: Wheel, new: Wheel, outside: Outside, target: str, uses: list[Use]) -> Entry | None:
    entry = Entry(target, uses, resolve(old, target), resolve(new, target))
    if entry.status in ("changed", "unchanged"):
        return entry
    base = next((f.outside for f in (entry.old, entry.new) if f is not None and f.outside), None)
    entry.owner = outside.owner(base, target.split(".")[-1]) if base and "." in target else None
    if entry.owner is None and any(use.library == "transformers" for use in uses):
        entry.owner = "transformers (not installed here: unchecked)"
    if entry.owner is None and all(use.how == "overrides" for use in uses):
        return None  # the library's own member, on no class it derives
    return entry


def _other_changes(old: Wheel, new: Wheel, class_name: str) -> list[str]:
    """`class_name`'s own members (methods, fields, attributes) that differ between the wheels."""
    members = [(wheel.find_class(class_name) or (None, None))[1] for wheel in (old, new)]
    names = sorted(set().union(*(bound_names(stmt) for cls in members if cls for stmt in cls.body)))
    changed = []
    for member in names:
        pair = [_member(cls.body, member) if cls else None for cls in members]
        if None in pair or ast.dump(pair[0]) != ast.dump(pair[1]):
            changed.append(f"{class_name}.{member}")
    return changed


def compare(old: Wheel, new: Wheel, uses: list[Use]) -> Drift:
    """Every used TRL name looked up in both wheels, and the other changed members of the classes subclassed."""
    by_target: dict[str, list[Use]] = {}
    for use in uses:
        by_target.setdefault(use.target, []).append(use)
    outside = Outside()
    entries = [e for t, u in by_target.items() if (e := _entry(old, new, outside, t, u)) is not None]
    touched = {e.target for e in entries}
    subclassed = sorted({use.target.split(".")[0] for use in uses if use.how == "overrides"})
    others = [name for cls in subclassed for name in _other_changes(old, new, cls) if name not in touched]
    return Drift(entries, others, old.path, new.path)


def _uses_text(uses: list[Use]) -> list[str]:
    lines = []
    for how in ("mirrors", "overrides", "imports"):
        places = [use.where for use in uses if use.how == how]
        if places:
            lines.append(f"      {how:<9} " + ", ".join(places))
    return lines


def _changed(title: str, entries: list[Entry]) -> list[str]:
    changed = [e for e in entries if e.status == "changed"]
    lines = [title.format(len(changed))]
    for entry in changed:
        lines += [f"  {entry.name}: {_line_counts(entry.old, entry.new)}", *_uses_text(entry.uses)]
    return lines


def format_drift(drift: Drift, package: str = "trl_groupopt") -> str:
    """The report `main` prints."""
    old, new = (path.name.split("-")[1] for path in (drift.old, drift.new))
    title = f"TRL {old} -> {new}: what {package}/ mirrors, overrides or imports from TRL, compared by AST"
    lines = [title, ""]
    kept = [e for e in drift.entries if any(u.how != "imports" for u in e.uses)]
    lines += _changed("Changed ({}): re-read each in the new TRL, then the library's places named below", kept)
    unchanged = sorted(e.name for e in kept if e.status == "unchanged")
    lines += ["", f"Unchanged ({len(unchanged)}):", *(f"  {name}" for name in unchanged)]
    outside = [e for e in kept if e.status == "outside"]
    lines += ["", f"Defined outside TRL ({len(outside)}): in transformers or the standard library, compare by hand"]
    for entry in outside:
        lines += [f"  {entry.target}: {entry.owner}.{entry.target.split('.')[-1]}", *_uses_text(entry.uses)]
    unresolved = [use for e in kept if e.status == "unresolved" for use in e.uses]
    lines += ["", f"Markers that name no TRL function ({len(unresolved)}): check by hand"]
    lines += [f"  {use.where}: {use.text}" for use in unresolved]
    lines += ["", f"Other changed members of the TRL classes the library subclasses ({len(drift.others)}):"]
    lines += [f"  {name}" for name in drift.others]
    helpers = [e for e in drift.entries if e not in kept]
    return "\n".join([*lines, "", *_changed("Changed TRL helpers the library imports ({}):", helpers)])


def wheel_for(spec: str, cache: Path) -> Path:
    """A wheel file as given, or TRL `spec` (a version) from `cache`, downloaded there (`pip download`) if missing."""
    if spec.endswith(".whl"):
        if not Path(spec).is_file():
            raise SystemExit(f"trl_drift: no wheel at {spec}")
        return Path(spec)
    cached = sorted(cache.glob(f"trl-{spec}-*.whl"))
    if not cached:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"trl=={spec}", "-d", str(cache)]
        done = subprocess.run(command, capture_output=True, text=True)
        cached = sorted(cache.glob(f"trl-{spec}-*.whl"))
        if done.returncode != 0 or not cached:
            raise SystemExit(f"trl_drift: cannot get the trl {spec} wheel ({' '.join(command)}):\n{done.stderr}")
    return cached[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="TRL version (e.g. 1.15.0) or path to its wheel")
    parser.add_argument("new", help="TRL version (e.g. 1.16.0) or path to its wheel")
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help=f"wheel cache (default {DEFAULT_WHEELS})")
    parser.add_argument("--package", type=Path, default=REPO / "trl_groupopt", help="the library's source folder")
    args = parser.parse_args(argv)
    try:
        old, new = (Wheel(wheel_for(spec, args.wheels)) for spec in (args.old, args.new))
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    print(format_drift(compare(old, new, library_uses(args.package)), args.package.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
