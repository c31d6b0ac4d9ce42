"""The library's side of `scripts/trl_drift.py`: every place `trl_groupopt/` depends on a TRL name, read from source.

Every `# mirrors <name> (trl X)` comment, every member a class deriving a TRL class defines (directly or through the
package's own classes and mixins, by AST), and the names imported from TRL's modules other than `trl` itself.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"#\s*mirrors\b\s*(?P<rest>.*)")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(frozen=True)
class Use:
    """One place where the library depends on a TRL name."""

    target: str  # "GRPOTrainer.__init__", "trl.trainer.utils.shuffle_sequence_dict", "GRPOTrainer.process_slice"
    how: str  # "mirrors", "overrides" or "imports"
    where: str  # "trainer/base.py:82 (GroupOptTrainer)"
    library: str | None = None  # "transformers" when a marker says so
    text: str = ""  # a marker's comment


def marker_target(text: str) -> tuple[str | None, str | None]:
    """(target, library) of a `# mirrors ...` comment; target None where it names no TRL function."""
    rest = MARKER.match(text)["rest"]
    library = (re.search(r"\((trl|transformers)\b", rest) or [None, None])[1]
    head, quoted = DOTTED.match(rest), re.search(rf"`({DOTTED.pattern})`", rest)
    bare = re.search(r"TRL's `([A-Za-z_]\w*)`", rest)  # a GRPOTrainer member
    return (head[0] if head else quoted[1] if quoted else f"GRPOTrainer.{bare[1]}" if bare else None), library


def bound_names(stmt: ast.stmt) -> set[str]:
    """The names a top-level or class-level statement binds (imports, defs, assignments, inside try/if)."""
    if isinstance(stmt, DEFS):
        return {stmt.name}
    nodes = list(ast.walk(stmt))
    return (
        {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        | {(node.asname or node.name).split(".")[0] for node in nodes if isinstance(node, ast.alias)}
        | {node.name for node in nodes if isinstance(node, DEFS)}
    )


def base_names(cls: ast.ClassDef) -> list[str]:
    return [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in cls.bases]


def origins(tree: ast.Module, nested: bool = False) -> dict[str, str]:
    """Local name -> "module.Name" of a module's absolute `from module import Name` (`nested`: in functions too)."""
    nodes = ast.walk(tree) if nested else tree.body
    return {
        alias.asname or alias.name: f"{node.module}.{alias.name}"
        for node in nodes
        if isinstance(node, ast.ImportFrom) and not node.level
        for alias in node.names
    }


def library_uses(package: Path) -> list[Use]:
    """Every mirror marker, TRL override and TRL import of the package, in file order."""
    uses, classes, trl_names = [], {}, {}
    for path in sorted(package.rglob("*.py")):
        source, rel = path.read_text(encoding="utf-8"), path.relative_to(package).as_posix()
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and MARKER.match(token.string):
                target, library = marker_target(token.string)
                uses.append(Use(target or token.string, "mirrors", f"{rel}:{token.start[0]}", library, token.string))
        tree = ast.parse(source, filename=str(path))
        imports = {local: origin for local, origin in origins(tree, nested=True).items() if origin[:4] == "trl."}
        trl_names.update({local: origin.rpartition(".")[2] for local, origin in imports.items()})
        for origin in sorted(set(imports.values())):
            if origin.count(".") > 1:  # helpers of TRL's modules; `from trl import X` is the public API
                uses.append(Use(origin, "imports", rel))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (rel, node))
    uses += _overrides(classes, trl_names)
    return uses


def _overrides(classes: dict[str, tuple[str, ast.ClassDef]], trl_names: dict[str, str]) -> list[Use]:
    """The members each package class (with its package bases and mixins) defines over the TRL classes it derives."""

    def lineage(name: str, seen: frozenset = frozenset()) -> tuple[set[str], set[str]]:  # (TRL bases, package classes)
        trl, own = set(), {name}
        for base in base_names(classes[name][1]):
            if base in classes and base not in seen:
                more_trl, more_own = lineage(base, seen | {name})
                trl, own = trl | more_trl, own | more_own
            elif base in trl_names:
                trl.add(trl_names[base])
        return trl, own

    uses = {}  # a mixin's member overrides the TRL class of every class it is mixed into: once each
    for name in classes:
        trl_bases, own = lineage(name)
        for klass in sorted(own if trl_bases else ()):
            rel, node = classes[klass]
            for stmt in node.body:
                for member in sorted(bound_names(stmt)) if not isinstance(stmt, ast.Expr) else ():
                    for base in sorted(trl_bases):
                        use = Use(f"{base}.{member}", "overrides", f"{rel}:{stmt.lineno} ({klass})")
                        uses.setdefault(use, None)
    return list(uses)
