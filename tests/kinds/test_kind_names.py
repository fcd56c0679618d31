"""No module outside `kinds/` and `config/` decides by a kind's name: the registry
resolves a name once into a `Kind`, and the shared code asks that object. Read from the
source (`ast`), so that a comparison brought back anywhere fails here, whoever adds it."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import reagent_lite.version
from reagent_lite.kinds import get_kind
from reagent_lite.kinds.registry import kind_names, specs

PACKAGE = Path(reagent_lite.version.__file__).parent
# Where kind names and kind classes belong: the kinds themselves and the config union.
ALLOWED = ("kinds/", "config/")


def kind_classes() -> set[str]:
    """Names of the classes only one kind has: its config model, its `Kind`, its feature
    space and whatever else its module defines (serving modules, acting)."""
    out: set[str] = set()
    for spec in specs():
        kind = get_kind(spec.name)
        out |= {spec.config.__name__, type(kind).__name__, kind.space_type.__name__}
        module = ast.parse(inspect.getsource(sys.modules[type(kind).__module__]))
        out |= {n.name for n in module.body if isinstance(n, ast.ClassDef)}
    return out - {"FeatureSpace"}  # the shared base of every kind's space


def _names_kind(node: ast.expr, names: set[str]) -> bool:
    """`node` is a kind name, or a literal collection holding one."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_kind(e, names) for e in node.elts)
    return False


def _class_names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _class_names(e)]
    return []


def kind_decisions(source: str, names: set[str], classes: set[str]) -> list[str]:
    """Where `source` decides by a kind's name or class: a comparison (`==`, `!=`, `in`)
    against a kind name, a hand-written collection of kind names, a dict keyed by one, a
    `match` case on one, an `isinstance`/`issubclass` against a kind's own class."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and any(
            _names_kind(o, names) for o in (node.left, *node.comparators)
        ):
            found.append(f"{line}: compares with a kind name")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            value = node.value
            if isinstance(value, ast.Tuple | ast.List | ast.Set) and _names_kind(value, names):
                found.append(f"{line}: a hand-written list of kinds")
        elif isinstance(node, ast.Dict) and any(
            k is not None and _names_kind(k, names) for k in node.keys
        ):
            found.append(f"{line}: a dict keyed by kind name")
        elif isinstance(node, ast.MatchValue) and _names_kind(node.value, names):
            found.append(f"{line}: a match case on a kind name")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
            and set(_class_names(node.args[1])) & classes
        ):
            found.append(f"{line}: {node.func.id} against a kind's own class")
    return found


def test_the_scan_sees_each_form_of_a_kind_decision() -> None:
    names, classes = set(kind_names()), kind_classes()
    assert {"DQNWorkflowConfig", "DiscreteSpace", "ParametricKind"} <= classes
    forms = [
        'if model.kind == "dqn": pass',
        'ok = "parametric_dqn" != kind',
        'ok = kind in ("dqn", "parametric_dqn")',
        'SERVED = ("dqn", "parametric_dqn")',
        'columns = {"dqn": 1, "parametric_dqn": 2}[kind]',
        'match kind:\n    case "dqn": pass',
        "ok = isinstance(space, DiscreteSpace)",
        "ok = isinstance(cfg, (config.BaseWorkflowConfig, config.ParametricDQNWorkflowConfig))",
    ]
    for form in forms:
        assert kind_decisions(form, names, classes), form
    # What is not a decision: a name written into a config, a kind's name passed on.
    assert not kind_decisions('cfg = {"workflow": "dqn"}; get_kind(meta["workflow"])', names,
                              classes)  # fmt: skip


def test_no_module_outside_the_kinds_decides_by_a_kind_name() -> None:
    names, classes = set(kind_names()), kind_classes()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"{rel}:{hit}" for hit in kind_decisions(path.read_text(), names, classes)]
    assert not found, (
        "decided by a kind's name or class outside kinds/ and config/ (ask the `Kind` "
        f"instead; docs/DESIGN.md 'Adding a kind'): {found}"
    )
