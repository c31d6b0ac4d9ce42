"""The package's shape, read from its source (no process, no model): issue 36's acceptance checks.

- no import cycle between modules of `trl_groupopt`, counting every import (module level, inside functions, under
  `TYPE_CHECKING`, relative and absolute);
- no private argparse or TRL attribute (`__closure__`, `_actions`, `_Store*Action`) outside a function marked as a
  mirror of TRL code (`# mirrors ...`);
- the generic modules (all but a method's own `objectives/<m>.py`, `trainers/<m>.py`, `methods/<m>.py`) name no
  specific method: no registered method or estimator name as a string literal, no import of a method's module;
- each TRL hook is overridden once in the shared layer (the trainer modules that are not a method's own).

Each checker is also run on a small made-up package that breaks its rule, so none of them passes vacuously.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT
from trl_groupopt import METHODS
from trl_groupopt.core.estimators import ESTIMATORS

PACKAGE = REPO_ROOT / "trl_groupopt"
PRIVATE_ATTRIBUTES = ("__closure__", "_actions")
#: The method the shared layer itself trains (TRL's GRPO, `GroupOptTrainer`): its name is also TRL's vocabulary
#: (`loss_type="grpo"`, the default estimator "grpo"), so only the other methods' names count as naming a method.
BASELINE = frozenset(name for name, spec in METHODS.items() if spec.trainer_name == "GroupOptTrainer")
#: Every name a method goes by (registry keys) and the modules a method owns (named after it).
METHOD_NAMES = (frozenset(METHODS) | frozenset(ESTIMATORS)) - BASELINE


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


def _functions(tree: ast.AST) -> Iterator[ast.AST]:
    yield from (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def private_uses(path: Path) -> list[str]:
    """Private argparse / TRL attributes used outside a function whose source says `# mirrors`."""
    source = path.read_text()
    tree = ast.parse(source)
    mirrored = set()
    for function in _functions(tree):
        if "# mirrors" in (ast.get_source_segment(source, function) or ""):
            mirrored |= {id(node) for node in ast.walk(function)}
    found = []
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        private = name in PRIVATE_ATTRIBUTES or (name or "").startswith("_Store") and (name or "").endswith("Action")
        if private and id(node) not in mirrored:
            found.append(f"{path.name}:{node.lineno}: {name}")
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
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_no_private_argparse_or_trl_attribute_outside_a_mirror():
    offenders = {module: private_uses(path) for module, path in modules(PACKAGE).items()}
    offenders = {module: uses for module, uses in offenders.items() if uses}
    assert offenders == {}, offenders


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
    assert {where for classes in overrides.values() for where in classes} == {"base.GroupOptTrainer"}


#: What a method trainer may define besides `objective`: ECHO's extra forward (the step totals of its wide scopes).
EXTRA_FORWARD = {"ECHOTrainer": {"_compute_loss", "_step_micro_batches", "_compute_step_totals"}}


def test_method_trainers_override_objective_only():
    """Which method, its modes' whole-group needs and a replaced TRL warning are class data (`GroupOptTrainer`)."""
    trainers = {spec.trainer_class for spec in METHODS.values()} - {METHODS[name].trainer_class for name in BASELINE}
    assert len(trainers) >= 4
    for trainer in trainers:
        defined = {name for name, value in vars(trainer).items() if inspect.isfunction(value)} - {"objective"}
        assert defined == EXTRA_FORWARD.get(trainer.__name__, set()), (trainer.__name__, defined)


# ------------------------------------------------------------------------------------------------ the checkers fail
@pytest.fixture
def broken_package(tmp_path) -> Path:
    """A package with a function-level import cycle (a -> b.c -> a), a private argparse attribute outside a mirror
    and one inside, and a generic module naming a method."""
    package = tmp_path / "pkg"
    (package / "b").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "b" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import c\n\nMETHOD = 'echo'\n")
    (package / "b" / "c.py").write_text(
        "def late():\n    from .. import a\n    return a.parser._actions\n\n\n"
        "def mirrored(parser):\n    # mirrors GRPOTrainer.x (trl 1.16.0)\n    return parser._actions\n"
    )
    (package / "d.py").write_text("import pkg.b.c\n")
    return package


def test_the_checkers_find_what_they_look_for(broken_package):
    graph = import_graph(broken_package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b.c"}, "pkg.b": set(), "pkg.b.c": {"pkg.a"}, "pkg.d": {"pkg.b.c"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b.c", "pkg.a"]
    assert find_cycle({**graph, "pkg.b.c": set()}) is None
    assert private_uses(broken_package / "b" / "c.py") == ["c.py:3: _actions"]
    assert [line for line in (broken_package / "a.py").read_text().splitlines() if "'echo'" in line]
    a = ast.parse((broken_package / "a.py").read_text())
    assert [n.value for n in ast.walk(a) if isinstance(n, ast.Constant) and n.value in METHOD_NAMES] == ["echo"]
    overrides = hook_overrides([broken_package / "b" / "c.py", REPO_ROOT / "trl_groupopt/trainer/base.py"], {"train"})
    assert overrides == {"train": ["base.GroupOptTrainer"]}
