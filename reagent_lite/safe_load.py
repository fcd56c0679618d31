"""Loading files the tool did not necessarily write itself, without running code from them.

Checkpoints, warm-start weights and `model.pt2` may come from a shared filesystem that
others can write to. Two rules:

* state files (`checkpoints/*.pt`, `model_state.pt`) are read with
  `torch.load(weights_only=True)`: tensors, numbers, strings and containers only;
* a `model.pt2` is checked member by member *before* torch's loader sees it
  (`check_pt2`). torch's loader unpickles in several places — pickled weights and
  constants, torchbind and opaque objects, legacy `.pt` payloads, sample inputs (it retries
  them without `weights_only` when the safe load fails), AOTInductor members — evaluates
  the symbolic shape expressions with `sympy.sympify` (an `eval`) and compiles the input
  guards into Python (`guards_code`) when `.module()` is called; a graph node may name any
  attribute reachable from `torch` as its function. So an archive passes only if it has
  none of those pickle members, its sample inputs load with `weights_only=True`, every
  node calls an ATen operator or `operator.getitem`, and every expression and guard is
  made of the few tokens an exported batch dimension produces.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from reagent_lite.errors import ConfigError

# Members of a torch.export archive (under its one top-level folder) that may exist.
_MEMBER = re.compile(
    r"^(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/[\w.-]+\.json|data/weights/[\w.-]+|data/constants/[\w.-]+"
    r"|data/sample_inputs/[\w.-]+\.pt)$"
)
# ATen operators, and the side-effect-free `operator` functions torch uses on sizes
# (`operator.call`, `attrgetter` or `methodcaller` could reach anything: not listed).
_TARGET = re.compile(
    r"^(torch\.ops\.aten\.\w+\.\w+|torch\.sym_(?:max|min|not|int|float|sqrt)"
    r"|_operator\.(?:getitem|add|sub|mul|floordiv|truediv|mod|pow|neg|eq|ne|lt|le|gt|ge"
    r"|and_|or_))$"
)
# sympy's srepr of batch-size symbols and their arithmetic (`Symbol('s51', positive=True,
# integer=True)`, `Integer(4)`, `Mul(Integer(2), Symbol(...))`).
_EXPR_TOKENS = re.compile(
    r"Symbol|Integer|Add|Mul|Max|Min|Mod|FloorDiv|positive|integer|nonnegative|True|False"
    r"|'[a-z]\d+'|-?\d+|[(),=\s]"
)
# Guards torch writes for inputs' sizes: `L['state_values'].size()[0] == L['x'].size()[0]`.
# Parametric models add `max(1, (L['a'].size()[1]*L['a'].size()[0]) // L['c'].size()[0])`.
_GUARD_TOKENS = re.compile(
    r"L\['[A-Za-z_]\w*'\]|\.size\(\)|\[\d+\]|==|!=|<=|>=|<|>|//|\b(?:and|or|not|max|min)\b|\d+"
    r"|[()+*%,\-\s]"
)


def load_state(path: Path) -> Any:
    """A state file (checkpoint, model_state.pt) with the weights-only unpickler."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load_program(path: Path, what: str) -> Any:
    """`torch.export.load(path)` once `check_pt2` passes; a file that is not a readable
    archive, or fails the check, is a `ConfigError` naming `what`."""
    check_pt2(path, what)
    try:
        return torch.export.load(str(path))
    except Exception as err:  # a damaged archive torch cannot deserialize
        raise ConfigError(f"{what}: '{path}' cannot be loaded ({_first_line(err)})") from err


def check_pt2(path: Path, what: str) -> None:
    """`ConfigError` unless `path` is a torch.export archive that loads without unpickling
    or evaluating anything it holds (see the module notes)."""
    try:
        with zipfile.ZipFile(path) as archive:
            _check_archive(archive, what, path)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ConfigError(
            f"{what}: '{path}' is not a readable torch.export archive ({_first_line(err)}; "
            "truncated or not a model.pt2?)"
        ) from err


def _check_archive(archive: zipfile.ZipFile, what: str, path: Path) -> None:
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{what}: '{path}' refused: {why} (reagent-lite loads no code)")

    names = archive.namelist()
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or any("/" not in n for n in names):
        raise refuse("not a torch.export archive of one folder")
    root = roots.pop() + "/"
    members = {n[len(root) :]: n for n in names if not n.endswith("/")}
    for name in members:
        if not _MEMBER.match(name) or (name.endswith("/version") and name != ".data/version"):
            raise refuse(f"unexpected member '{name[:80]}'")
    if archive.read(members.get("archive_format", "")).decode(errors="replace") != "pt2":
        raise refuse("archive_format is not pt2")
    models = [n for n in members if n.startswith("models/")]
    if not models:
        raise refuse("it holds no model")
    for name in members:
        if name.endswith("_config.json"):
            _check_payloads(_json(archive, members[name], refuse), name, refuse)
        elif name.startswith("data/sample_inputs/"):
            try:
                torch.load(io.BytesIO(archive.read(members[name])), weights_only=True)
            except Exception as err:
                raise refuse(f"{name} is not plain tensors ({_first_line(err)})") from err
        elif name.startswith(("data/weights/", "data/constants/")) and name.endswith(".pt"):
            raise refuse(f"legacy pickled payload '{name}'")
    for name in models:
        _check_graph(_json(archive, members[name], refuse), refuse)


def _check_payloads(config: Any, name: str, refuse: Any) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise refuse(f"{name} is not a payload table")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise refuse(f"{name}: '{str(fqn)[:80]}' is pickled")
        if not str(meta.get("path_name", "")).startswith(("weight_", "tensor_")):
            raise refuse(f"{name}: '{str(fqn)[:80]}' is not a tensor")


def _check_graph(model: Any, refuse: Any) -> None:
    for key, value in _strings(model):
        if key == "target" and not _TARGET.match(value):
            raise refuse(f"graph node calls '{value[:80]}', not an ATen operator")
        if key == "expr_str" and _leftover(_EXPR_TOKENS, value):
            raise refuse(f"shape expression '{value[:80]}' is not a plain size expression")
        if key == "guards_code" and _leftover(_GUARD_TOKENS, value):
            raise refuse(f"input guard '{value[:80]}' is not a plain size comparison")


def _leftover(tokens: re.Pattern[str], text: str) -> bool:
    """Whether `text` holds anything but `tokens`."""
    return bool(tokens.sub("", text))


def _json(archive: zipfile.ZipFile, member: str, refuse: Any) -> Any:
    try:
        return json.loads(archive.read(member))
    except (ValueError, RecursionError) as err:  # not JSON, or nested past the parser's limit
        raise refuse(f"{member.split('/', 1)[-1]} is not valid JSON") from err


def _strings(obj: Any, key: str = "") -> list[tuple[str, str]]:
    """(nearest key, string) for every string in a JSON value, iteratively (no recursion
    limit for a deeply nested file)."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [(key, obj)]
    while stack:
        k, v = stack.pop()
        if isinstance(v, str):
            out.append((k, v))
        elif isinstance(v, dict):
            stack.extend((str(kk), vv) for kk, vv in v.items())
        elif isinstance(v, list):
            stack.extend((k, vv) for vv in v)
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]
