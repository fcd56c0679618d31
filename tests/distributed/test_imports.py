"""The distributed package's modules import one another in one direction only: no cycle,
counting every import (type-only ones under TYPE_CHECKING and those inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import reagent_lite.distributed

PACKAGE = Path(reagent_lite.distributed.__file__).parent
PREFIX = "reagent_lite.distributed."


def imports_of(path: Path) -> set[str]:
    """The sibling modules `path` imports anywhere in its text."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out.update(n[len(PREFIX) :].split(".")[0] for n in names if n.startswith(PREFIX))
    return out


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


def test_distributed_modules_have_no_import_cycle() -> None:
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph = {name: imports_of(path) & modules.keys() - {name} for name, path in modules.items()}
    assert "peer_sum" in graph["context"]  # the check reads the real imports
    assert find_cycle(graph) == []
