"""The package's modules import one another in one direction only: no cycle, counting
every import — type-only ones under TYPE_CHECKING and those inside functions too (a lazy
import is still a dependency: it only moves the failure to run time)."""

from __future__ import annotations

import ast
from pathlib import Path

import reagent_lite.version

PACKAGE = Path(reagent_lite.version.__file__).parent


def module_files() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package (a package is its
    `__init__.py`)."""
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports anywhere in its text: `from a.b import c` is
    module `a.b.c` where that is a module, else `a.b` (or its nearest enclosing module)."""

    def nearest(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    out: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(nearest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.update(nearest(f"{node.module}.{alias.name}") for alias in node.names)
    return {name for name in out if name is not None}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as a list of modules (first == last), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle() -> None:
    files = module_files()
    graph = {name: imports_of(path, set(files)) - {name} for name, path in files.items()}
    # The check reads the real imports: a type-only one, an in-function one, a package's.
    assert "reagent_lite.kinds.base" in graph["reagent_lite.kinds.registry"]
    assert "reagent_lite.api" in graph["reagent_lite"]
    assert "reagent_lite.distributed.failures" in graph["reagent_lite.distributed.context"]
    assert find_cycle(graph) == []
