"""The package's shape, read from its source (no process, no model): issue 36's and issue 44's acceptance checks.

- no import cycle between modules of `trl_groupopt` (the package root `trl_groupopt/__init__.py` included),
  counting every import (module level, inside functions, under `TYPE_CHECKING`, relative and absolute);
- TRL behind one boundary: no private attribute of TRL, transformers, accelerate or argparse is touched outside a
  mirror block or `trl_groupopt/trainer/boundary.py`. A *private name* is one a library's source defines with one
  leading underscore (`def _x`, `class _X`, `self._x = ...`, or `_x = ...` at module or class level) in the modules
  `LIBRARY_SOURCES` lists; *touching* it is an attribute access `<anything>._x` (so `self._x`, `super()._x` and
  `trainer._x` alike), a class body of ours defining `_x` (an override), or `from <library> import _x`; CPython's
  `__closure__` counts too. A *mirror block* is what `scripts/trl_mirrors.py` says a marker ``# mirrors <Target>
  (<library> <version>)`` vouches for: the innermost function whose lines hold the marker (counting the comment lines
  directly above its `def` and decorators), else the statement on the marker's line or directly below its comment
  lines; every node inside it is in the block. Our own private names that collide with a library's are renamed;
- every mirror marker is well formed, names a target the installed library has, and `docs/trl-upgrade.md`'s table of
  mirrors is the one `scripts/trl_mirrors.py` generates from them;
- the generic modules (all but those inside a method's folder, `trl_groupopt/methods/<m>/`) name no specific method:
  no registered method or estimator name as a string literal, no import of a method's module;
- each TRL hook is overridden once in the shared layer (the modules of `trl_groupopt/trainer/`), and a method's
  trainer overrides only what it must.

Each checker is also run on a small made-up package that breaks its rule, so none of them passes vacuously.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import importlib.util
import inspect
import shutil
import sys
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT
from trl_groupopt import METHODS
from trl_groupopt.core.estimators import ESTIMATORS

PACKAGE = REPO_ROOT / "trl_groupopt"
#: The one module of TRL contact points that are not mirror blocks.
BOUNDARY = PACKAGE / "trainer" / "boundary.py"
#: Where the libraries' private names are read: (package, glob patterns of its modules). TRL whole but
#: `trl/experimental` (which the library never imports); the parts of transformers and accelerate a trainer touches.
LIBRARY_SOURCES = (
    ("trl", ("**/*.py",)),
    ("transformers", ("trainer*.py", "training_args*.py", "modeling_utils.py", "hf_argparser.py",
                      "configuration_utils.py", "modelcard.py", "generation/utils.py", "integrations/peft.py")),
    ("accelerate", ("accelerator.py", "state.py", "data_loader.py", "optimizer.py", "scheduler.py", "utils/*.py")),
)  # fmt: skip
LIBRARIES = tuple(package for package, _ in LIBRARY_SOURCES)
#: Private attributes of the interpreter that count as well.
EXTRA_PRIVATE = frozenset({"__closure__"})
#: The method the shared layer itself trains (TRL's GRPO, `GroupOptTrainer`): its name is also TRL's vocabulary
#: (`loss_type="grpo"`, the default estimator "grpo"), so only the other methods' names count as naming a method.
BASELINE = frozenset(name for name, spec in METHODS.items() if spec.trainer_name == "GroupOptTrainer")
#: Every name a method goes by (registry keys) and the modules a method owns (named after it).
METHOD_NAMES = (frozenset(METHODS) | frozenset(ESTIMATORS)) - BASELINE


def _load_script(name: str):
    location = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(location)
    sys.modules[name] = module  # dataclasses read the module of their class
    location.loader.exec_module(module)
    return module


trl_mirrors = _load_script("trl_mirrors")


# ------------------------------------------------------------------------------------------------ reading the source
def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` (a folder holding `__init__.py`)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _base_of(module: str, path: Path, level: int) -> str:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules among `known` that `module` imports anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _base_of(module, path, node.level) if node.level else ""
            target = ".".join(part for part in (base, node.module or "") if part)
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            found |= submodules or {target}
    return {name for name in found if name in known and name != module}


def import_graph(package: Path) -> dict[str, set[str]]:
    known = modules(package)
    return {module: imports_of(module, path, set(known)) for module, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _method_module(module: str) -> bool:
    """A method's own module: one inside its folder, `trl_groupopt/methods/<m>/`."""
    return module.startswith("trl_groupopt.methods.") and module.count(".") >= 3


def method_names_in(module: str, path: Path) -> list[str]:
    """Where generic `module` names a specific method: string literals equal to a method name, method imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in METHOD_NAMES:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    all_modules = modules(PACKAGE)
    found += [f"imports {target}" for target in imports_of(module, path, set(all_modules)) if _method_module(target)]
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _class_level_names(item: ast.stmt) -> set[str]:
    """The names a statement of a class body defines: a method, or the targets of an assignment."""
    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {item.name}
    targets = (
        item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
    )
    return {e.id for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)}


def defined_private_names(tree: ast.AST) -> set[str]:
    """The private names a library module defines (see the module docstring)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef)):
            names |= {name for item in node.body for name in _class_level_names(item)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return {name for name in names if _is_private(name)}


@functools.cache
def library_private_names() -> frozenset[str]:
    """Every private name of `LIBRARY_SOURCES` and argparse, from their installed source (nothing imported)."""
    paths = [Path(argparse.__file__)]
    for package, patterns in LIBRARY_SOURCES:
        root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        found = {path for pattern in patterns for path in root.glob(pattern)}
        paths += [path for path in found if "experimental" not in path.relative_to(root).parts]
    names = set()
    for path in paths:
        names |= defined_private_names(ast.parse(path.read_text(encoding="utf-8")))
    return frozenset(names | EXTRA_PRIVATE)


def private_uses(path: Path, names: frozenset[str]) -> list[str]:
    """Where `path` touches one of the private `names` outside a mirror block (see the module docstring)."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    mirrored = {id(child) for _, _, block in trl_mirrors.blocks(source, tree) for child in ast.walk(block)}
    class_level = {id(item) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for item in node.body}
    found = []
    for node in ast.walk(tree):
        touched: set[str] = set()
        if isinstance(node, ast.Attribute):
            touched = {node.attr} & names
        elif isinstance(node, ast.ImportFrom) and (node.module or "").partition(".")[0] in LIBRARIES:
            touched = {alias.name for alias in node.names if _is_private(alias.name)}
        elif id(node) in class_level:
            touched = _class_level_names(node) & names  # an override of the library's private member
        found += [f"{path.name}:{node.lineno}: {name}" for name in sorted(touched) if id(node) not in mirrored]
    return found


def hook_overrides(paths: list[Path], hooks: set[str]) -> dict[str, list[str]]:
    """hook -> the classes (in `paths`) that define it."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in hooks:
                        found.setdefault(item.name, []).append(f"{path.stem}.{node.name}")
    return found


# ------------------------------------------------------------------------------------------------ the package
def test_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 40 and "trl_groupopt.methods.spec" in graph["trl_groupopt.methods.registry"]
    assert "trl_groupopt.methods.registry" in graph["trl_groupopt"]  # the root's function-level import counts
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_trl_private_attributes_only_in_mirror_blocks_or_the_boundary():
    names = library_private_names()
    assert {"_metrics", "_buffered_inputs", "_step", "_name", "_load_from_checkpoint", "_actions"} <= names
    checked = {module: path for module, path in modules(PACKAGE).items() if path != BOUNDARY}
    assert "trl_groupopt.trainer.base" in checked and "trl_groupopt" in checked
    offenders = {module: private_uses(path, names) for module, path in checked.items()}
    assert {module: uses for module, uses in offenders.items() if uses} == {}
    assert private_uses(BOUNDARY, names)  # the contact points are there, not gone


def test_mirror_markers_are_well_formed_and_name_what_the_library_has():
    comments = [(path, line, text) for path in sorted(PACKAGE.rglob("*.py"))
                for line, text in trl_mirrors.comments(path.read_text(encoding="utf-8"))
                if trl_mirrors.ANY_MARKER.match(text)]  # fmt: skip
    assert [(p.name, line, t) for p, line, t in comments if not trl_mirrors.MARKER.search(t)] == []
    mirrors = trl_mirrors.mirrors()
    assert len(mirrors) == len(comments) >= 20
    for mirror in mirrors:
        assert _resolve(mirror.target, mirror.library) is not None, mirror


def _resolve(target: str, library: str):
    """The object `target` names: a dotted path (`trl.trainer.utils.x`), or `Class.member` of the library's top
    level (`GRPOTrainer._compute_loss`, `Trainer._save_checkpoint`)."""
    parts = target.split(".")
    if parts[0] != library:
        parts = [library, *parts]
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            found = getattr(found, part, None)
        return found
    return None


def test_the_mirror_table_is_generated_from_the_markers():
    """docs/trl-upgrade.md's table is `scripts/trl_mirrors.py`'s (run it to rewrite the table)."""
    assert trl_mirrors.documented() == trl_mirrors.table()
    blocks = {(m.block, m.path.name) for m in trl_mirrors.mirrors()}
    assert {("readable_gold", "adapters.py"), ("symmetric_clip_loss", "grpo_fix.py"),
            ("ECHOTrainer._compute_step_totals", "trainer.py"), ("TRL_REWARD_KWARGS", "checks.py"),
            ("warn_if_inert_on_policy", "schedule.py")} <= blocks  # fmt: skip


def test_generic_modules_name_no_method():
    generic = {module: path for module, path in modules(PACKAGE).items() if not _method_module(module)}
    assert "trl_groupopt.trainer.base" in generic and "trl_groupopt.methods.echo.trainer" not in generic
    offenders = {module: method_names_in(module, path) for module, path in generic.items()}
    offenders = {module: names for module, names in offenders.items() if names}
    assert offenders == {}, offenders


def test_each_trl_hook_is_overridden_once_in_the_shared_layer():
    from trl import GRPOTrainer

    shared = [path for module, path in modules(PACKAGE / "trainer").items() if not _method_module(module)]
    hooks = {name for name in dir(GRPOTrainer) if callable(getattr(GRPOTrainer, name)) and not name.startswith("__")}
    overrides = hook_overrides(shared, hooks)
    assert {"train", "_save", "_compute_loss", "_generate_and_score_completions"} <= set(overrides)
    assert {hook: where for hook, where in overrides.items() if len(where) > 1} == {}
    assert {where for classes in overrides.values() for where in classes} == {"base.GroupOptTrainer",
                                                                              "boundary.TRLHooks"}  # fmt: skip


#: What a method trainer may define besides `objective`: ECHO's extra forward (the step totals of its wide scopes).
EXTRA_FORWARD = {
    "ECHOTrainer": {
        "loss_inputs",
        "_step_micro_batches",
        "_compute_step_totals",
        "_why_step_totals_need_a_forward",
        "_step_spans_micro_batches",
    }
}


def test_method_trainers_override_objective_only():
    """Which method, its modes' whole-group needs and a replaced TRL warning are class data (`GroupOptTrainer`)."""
    trainers = {spec.trainer_class for spec in METHODS.values()} - {METHODS[name].trainer_class for name in BASELINE}
    assert len(trainers) >= 5
    for trainer in trainers:
        defined = {name for name, value in vars(trainer).items() if inspect.isfunction(value)} - {"objective"}
        assert defined == EXTRA_FORWARD.get(trainer.__name__, set()), (trainer.__name__, defined)


# ------------------------------------------------------------------------------------------------ the checkers fail
@pytest.fixture
def broken_package(tmp_path) -> Path:
    """A package with a function-level import cycle (a -> b.c -> a), private argparse and TRL attributes outside a
    mirror and inside one, and a generic module naming a method."""
    package = tmp_path / "pkg"
    (package / "b").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "b" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import c\n\nMETHOD = 'echo'\n")
    (package / "b" / "c.py").write_text(
        "from trl import GRPOTrainer\n\n\n"
        "def late():\n    from .. import a\n    return a.parser._actions\n\n\n"
        "def mirrored(parser):\n    # mirrors GRPOTrainer.x (trl 1.16.0)\n    return parser._actions\n\n\n"
        "class Trainer(GRPOTrainer):\n"
        "    def step(self):\n        return self._buffered_inputs, super()._compute_loss\n\n"
        "    # mirrors GRPOTrainer._prepare_inputs (trl 1.16.0): its buffer\n"
        "    def _prepare_inputs(self, batch):\n        return self._buffered_inputs[self._step]\n\n"
        "    def _save(self, output_dir=None, state_dict=None):\n        pass\n"
    )
    (package / "d.py").write_text("import pkg.b.c\n")
    return package


def test_the_checkers_find_what_they_look_for(broken_package):
    graph = import_graph(broken_package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b.c"}, "pkg.b": set(), "pkg.b.c": {"pkg.a"}, "pkg.d": {"pkg.b.c"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b.c", "pkg.a"]
    assert find_cycle({**graph, "pkg.b.c": set()}) is None
    found = private_uses(broken_package / "b" / "c.py", library_private_names())
    # outside the mirrors: argparse's `_actions`, TRL's buffer through `self` and a hook through `super()`, an override
    assert sorted(found) == [
        "c.py:16: _buffered_inputs",
        "c.py:16: _compute_loss",
        "c.py:22: _save",
        "c.py:6: _actions",
    ]
    assert [line for line in (broken_package / "a.py").read_text().splitlines() if "'echo'" in line]
    a = ast.parse((broken_package / "a.py").read_text())
    assert [n.value for n in ast.walk(a) if isinstance(n, ast.Constant) and n.value in METHOD_NAMES] == ["echo"]
    overrides = hook_overrides([broken_package / "b" / "c.py", REPO_ROOT / "trl_groupopt/trainer/base.py"], {"train"})
    assert overrides == {"train": ["base.GroupOptTrainer"]}


def test_a_private_trl_attribute_planted_in_the_trainer_fails_the_check(tmp_path):
    """The trainer's own module, copied with one line more: TRL's buffer read outside any mirror block."""
    names = library_private_names()
    planted = tmp_path / "base.py"
    shutil.copy(PACKAGE / "trainer" / "base.py", planted)
    assert private_uses(planted, names) == []
    source = planted.read_text(encoding="utf-8")
    anchor = "    def compute_advantages(self"
    line = source[: source.index(anchor)].count("\n") + 3
    planted.write_text(
        source.replace(anchor, "    def peek(self):\n        return self._buffered_inputs\n\n" + anchor)
    )
    assert private_uses(planted, names) == [f"base.py:{line - 1}: _buffered_inputs"]
