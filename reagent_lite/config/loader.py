"""Read a JSON config, migrate Horizon-era keys, validate, and explain every problem.

`load_config(path, cls)` is the only way the workflows read a config. Errors are one
`ConfigError` whose message has one line per problem:

    <file>: <json.path>: <what is wrong> (got <value>)

Horizon-era keys are mapped, dropped with a warning, or refused by `config.horizon`
before validation (never silently).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from reagent_lite.config.horizon import _ANY as _ANY
from reagent_lite.config.horizon import HORIZON_IGNORED as HORIZON_IGNORED
from reagent_lite.config.horizon import HORIZON_RENAMED as HORIZON_RENAMED
from reagent_lite.config.horizon import CompatKey as CompatKey
from reagent_lite.config.horizon import migrate_horizon as migrate_horizon
from reagent_lite.config.json_text import Duplicate, DuplicateKeys, key_lines, parse_json
from reagent_lite.config.json_text import show as _show
from reagent_lite.config.models import (
    BaseWorkflowConfig,
    ConfigProblem,
)
from reagent_lite.config.overrides import Overrides, apply_overrides
from reagent_lite.errors import ConfigError

logger = logging.getLogger("reagent_lite.config")

T = TypeVar("T", bound=BaseWorkflowConfig)


def config_class(kind: str) -> type[BaseWorkflowConfig]:
    """The config model of the registered workflow kind `kind` (`ConfigError` if unknown)."""
    # Imported here: `reagent_lite.kinds` registers the shipped kinds with their config
    # models, which import this package.
    from reagent_lite.kinds.registry import resolve_kind

    return resolve_kind(kind).config


def load_config(
    path: str | os.PathLike[str], cls: type[T], *, overrides: Overrides | None = None
) -> T:
    """Read, migrate and validate the JSON config at `path` as `cls`, with `overrides`
    (`key.path=value` strings or a mapping) applied first; `ConfigError` if bad."""
    data = read_config_file(path)
    source = str(path)
    if overrides and isinstance(data, dict):
        data = apply_overrides(data, overrides)
        source = f"{source} + overrides"
    return config_from_dict(data, cls, source=source)


def read_config_file(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of a config file, not yet validated; `ConfigError` if unreadable."""
    source = str(path)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, expected a JSON config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc}") from None
    try:
        data = parse_json(text)
    except DuplicateKeys as exc:
        raise ConfigError(
            "\n".join(_duplicate_line(source, text, dup) for dup in exc.duplicates)
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{source}: not valid JSON for a config: nested deeper than Python's parser allows"
        ) from None
    return data


def _duplicate_line(source: str, text: str, dup: Duplicate) -> str:
    lines = key_lines(text, dup.key)
    first, second = _show(dup.first), _show(dup.second)
    if len(lines) == 2:  # only when the lines are unambiguous
        first, second = f"{first} at line {lines[0]}", f"{second} at line {lines[1]}"
    return (
        f"{source}: {dup.path}: key given twice, and JSON would silently keep the last "
        f"(got {first}, then {second}); remove the one you do not mean"
    )


def config_from_dict(data: Any, cls: type[T], source: str = "<config>") -> T:
    """Validate an already parsed config (same migration and messages as `load_config`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the config must be a JSON object (got {_show(data)})")
    data = dict(data)
    data.pop("$schema", None)
    _check_workflow_kind(data, cls, source)
    data = migrate_horizon(data, source)
    try:
        cfg = cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, cls)) from None
    for where, why in settings_without_effect(cfg):
        logger.warning("%s: %s has no effect: %s", source, where, why)
    return cfg


def settings_without_effect(cfg: BaseWorkflowConfig) -> list[tuple[str, str]]:
    """(JSON path, why) for each setting that is valid but changes nothing in this config,
    so that a user who set it is told rather than silently ignored."""
    out: list[tuple[str, str]] = []
    if cfg.rl.softmax_policy:
        out.append(
            (
                "rl.softmax_policy",
                "model.pt2 returns Q values and CPE evaluates evaluation.policy (set it to "
                "'softmax' to evaluate the softmax of Q / rl.temperature)",
            )
        )
    if cfg.rl.epsilon > 0.0:
        out.append(
            (
                "rl.epsilon",
                "CPE evaluates evaluation.policy without ε exploration, and the online check "
                "is greedy",
            )
        )
    evaluation = cfg.evaluation
    if "temperature" in cfg.rl.model_fields_set and evaluation.policy == "greedy":
        out.append(
            (
                "rl.temperature",
                "CPE evaluates the greedy policy model.pt2 serves (evaluation.policy); the "
                "temperature only shapes evaluation.policy 'softmax'",
            )
        )
    if evaluation.model_selection != "last":
        if cfg.eval_data_path is None:
            out.append(
                (
                    "evaluation.model_selection",
                    f"{evaluation.model_selection!r} needs eval_data_path; the last epoch's "
                    "model is exported",
                )
            )
        elif evaluation.model_selection == "cpe" and not evaluation.calc_cpe_in_training:
            out.append(
                (
                    "evaluation.model_selection",
                    "'cpe' needs evaluation.calc_cpe_in_training; the last epoch's model is "
                    "exported",
                )
            )
    inputs = {"state": cfg.state_norm_data_path}
    inputs["action"] = cfg.optional_inputs().get("action_norm_data_path")
    for group, given in inputs.items():
        if given and cfg.normalization_overrides.for_group(group):
            out.append(
                (
                    f"normalization_overrides.{group}",
                    f"the {group} normalization is read from {given}, not fitted",
                )
            )
    sample = cfg.sample_data
    if evaluation.online_episodes > 0 and sample is not None and sample.kind != "gym":
        out.append(
            (
                "evaluation.online_episodes",
                f"only gym sample data has an environment to roll out in (sample_data.kind is "
                f"{sample.kind!r})",
            )
        )
    return out


def _check_workflow_kind(data: dict[str, Any], cls: type[BaseModel], source: str) -> None:
    # A config meant for another workflow would otherwise surface as a confusing
    # "unknown key: actions"; say what happened instead.
    from reagent_lite.kinds.registry import command_for, kind_names, resolve_kind, spec_of_config
    from reagent_lite.kinds.registry import specs as kind_specs

    mine = spec_of_config(cls) if issubclass(cls, BaseWorkflowConfig) else None
    if mine is None:
        return
    claimed = data.get("workflow", mine.name)
    if isinstance(claimed, str) and claimed != mine.name and claimed in kind_names():
        other, evidence = resolve_kind(claimed), f"workflow: {claimed}"
    elif claimed == mine.name and not mine.markers & data.keys():
        found = [s for s in kind_specs() if s is not mine and s.markers & data.keys()]
        if not found:
            return
        other, evidence = found[0], ", ".join(sorted(found[0].markers & data.keys()))
    else:
        return
    raise ConfigError(
        f"{source}: workflow: this is a {other.name} config (it has {evidence}); run it with "
        f"{command_for(other)}, or make it a {mine.name} config ({command_for(mine)}) "
        f"(got {_show(data.get('workflow', other.name))})"
    )


# Keys a release removed, by their JSON path: what a config that still has one is told
# instead of "unknown key", so that it learns the key is gone on purpose and why.
REMOVED_KEYS = {
    "training.step_plan.p2p_allreduce": "removed key: the peer-to-peer gradient sum it "
    "switched gained under 5% where used (+3% measured on 2 and 4 GPUs), so it was removed "
    "and gradients are summed by the process group's all-reduce (NCCL or gloo); delete the "
    "key",
}


def format_validation_error(exc: ValidationError, source: str, cls: type[BaseModel]) -> str:
    """One line per problem: `<file>: <json.path>: <what is wrong> (got <value>)`."""
    lines = []
    for err in exc.errors():
        loc: tuple[str | int, ...] = tuple(err["loc"])
        ctx = err.get("ctx") or {}
        cause = ctx.get("error")
        value = err.get("input")
        if isinstance(cause, ConfigProblem):
            loc = loc + cause.path
            msg, value = cause.message, cause.value
        elif err["type"] == "extra_forbidden":
            msg = REMOVED_KEYS.get(json_path(loc)) or "unknown key" + _suggest(loc, cls)
        elif err["type"] == "missing":
            lines.append(f"{source}: {json_path(loc)}: required key is missing")
            continue
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            msg = msg[:1].lower() + msg[1:]
        lines.append(f"{source}: {json_path(loc)}: {msg} (got {_show(value)})")
    return "\n".join(dict.fromkeys(lines))


def json_path(loc: tuple[str | int, ...]) -> str:
    """`("training", "layers", 2)` → `training.layers[2]`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<top level>"


def _suggest(loc: tuple[str | int, ...], cls: type[BaseModel]) -> str:
    # Walk the model tree along `loc` to find the known keys of the enclosing object.
    model: Any = cls
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        model = model_of_annotation(field.annotation)
        if model is None:
            return ""
    known = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def model_of_annotation(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None
