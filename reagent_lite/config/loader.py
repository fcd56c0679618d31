"""Read a JSON config, migrate Horizon-era keys, validate, and explain every problem.

`load_config(path, cls)` is the only way the workflows read a config. Errors are one
`ConfigError` whose message has one line per problem:

    <file>: <json.path>: <what is wrong> (got <value>)

Horizon compatibility: keys Horizon's workflows wrote that have no effect here are
accepted, removed and logged as a WARNING naming the key (never silently); those that
would change behaviour we do not implement (e.g. `"categorical": true`) are errors;
renamed ones (`use_layer_norm`, `in_training_cpe`) are mapped and logged at INFO.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from reagent_lite.config.models import (
    BaseWorkflowConfig,
    ConfigProblem,
)
from reagent_lite.config.overrides import Overrides, apply_overrides
from reagent_lite.errors import ConfigError

logger = logging.getLogger("reagent_lite.config")

T = TypeVar("T", bound=BaseWorkflowConfig)

_ANY = object()  # marker: every value is accepted (and ignored)


@dataclass(frozen=True)
class CompatKey:
    """A Horizon key accepted only for compatibility: it has no effect here."""

    note: str
    accepted: tuple[Any, ...] | object = _ANY  # values ignored; others are unsupported

    def accepts(self, value: Any) -> bool:
        if self.accepted is _ANY:
            return True
        assert isinstance(self.accepted, tuple)
        # `type(...) is` so that True never passes for 1 or 1.0 for True.
        return any(type(value) is type(a) and value == a for a in self.accepted)


# Object path ("" = top level) → Horizon key → why it is ignored.
HORIZON_IGNORED: dict[str, dict[str, CompatKey]] = {
    "": {
        "state_feature_params": CompatKey("feature-name overrides are not supported", (None,)),
        "target_action_distribution": CompatKey("not used by the evaluation here"),
    },
    "rl": {
        "reward_burnin": CompatKey("no reward burn-in phase here"),
        "set_missing_value_to_zero": CompatKey("missing features use a presence mask"),
        "tensorboard_logging_freq": CompatKey("metrics go to metrics.jsonl"),
        "predictor_atol_check": CompatKey("no Caffe2 predictor conversion check"),
        "predictor_rtol_check": CompatKey("no Caffe2 predictor conversion check"),
        "ratio_different_predictions_tolerance": CompatKey("no predictor conversion check"),
        "time_diff_unit_length": CompatKey("time_diff is used as is", (1, 1.0)),
        "multi_steps": CompatKey("multi-step returns are not supported", (None, 1)),
    },
    "rainbow": {
        "categorical": CompatKey("C51 is not supported", (False, 0)),
        "num_atoms": CompatKey("C51 is not supported"),
        "qmin": CompatKey("C51 is not supported"),
        "qmax": CompatKey("C51 is not supported"),
        "c51_l2_decay": CompatKey("C51 is not supported"),
        "quantile": CompatKey("QR-DQN is not supported", (False, 0)),
    },
    "training": {
        "use_noisy_linear_layers": CompatKey("noisy nets are not supported", (False, 0)),
        "lr_policy": CompatKey("lr_decay is applied once per epoch"),
        "weight_init_min_std": CompatKey("PyTorch default initialisation is used"),
        "use_batch_norm": CompatKey("batch norm is not supported; see layer_norm", (False, 0)),
        "cnn_parameters": CompatKey("CNN encoders are not supported", (None,)),
    },
}

# Horizon name → our name, within the same object.
HORIZON_RENAMED: dict[str, dict[str, str]] = {"training": {"use_layer_norm": "layer_norm"}}


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
        data = json.loads(text, parse_constant=_reject_constant)
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


def migrate_horizon(data: dict[str, Any], source: str = "<config>") -> dict[str, Any]:
    """Map Horizon-era keys onto ours; drop (and log) keys that have no effect here."""
    data = dict(data)
    problems: list[str] = []
    if "in_training_cpe" in data:
        # Horizon ran in-training CPE iff this block was present (not null).
        value = data.pop("in_training_cpe")
        evaluation = dict(data.get("evaluation") or {})
        if "calc_cpe_in_training" not in evaluation:
            evaluation["calc_cpe_in_training"] = value is not None
            data["evaluation"] = evaluation
            logger.info(
                "%s: in_training_cpe (Horizon) mapped to evaluation.calc_cpe_in_training=%s",
                source,
                value is not None,
            )
        if isinstance(value, dict) and value:
            logger.warning(
                "%s: in_training_cpe.%s ignored (Horizon compatibility only: CPE uses the "
                "whole eval_data_path)",
                source,
                ", in_training_cpe.".join(sorted(value)),
            )
    data = _migrate_bcq(data, source)
    norm = data.get("norm_params")
    if isinstance(norm, dict):
        for key in ("output_dir", "cols_to_norm"):
            if key in norm:
                logger.warning(
                    "%s: norm_params.%s ignored (Horizon compatibility only: normalization "
                    "is fitted on the state/action columns and written to model_output_path)",
                    source,
                    key,
                )
    for obj_path, keys in HORIZON_IGNORED.items():
        obj = data if obj_path == "" else data.get(obj_path)
        if not isinstance(obj, dict):
            continue
        obj = dict(obj)
        for key, compat in keys.items():
            if key not in obj:
                continue
            value = obj.pop(key)
            where = f"{obj_path}.{key}" if obj_path else key
            if not compat.accepts(value):
                problems.append(
                    f"{source}: {where}: Horizon option not supported: {compat.note} "
                    f"(got {_show(value)})"
                )
                continue
            logger.warning(
                "%s: %s ignored (Horizon compatibility only: %s)", source, where, compat.note
            )
        for old, new in HORIZON_RENAMED.get(obj_path, {}).items():
            if old in obj:
                value = obj.pop(old)
                if new not in obj:
                    obj[new] = False if value is None else value
                logger.info(
                    "%s: %s.%s (Horizon) read as %s.%s", source, obj_path, old, obj_path, new
                )
        if obj_path == "":
            data = obj
        else:
            data[obj_path] = obj
    if problems:
        raise ConfigError("\n".join(problems))
    return data


def _migrate_bcq(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Horizon's `rainbow.bcq` switch + `rainbow.bcq_drop_threshold` (default 0.1) as our
    `rainbow.bcq_drop_threshold` (null = off): Horizon configs carry the threshold even
    with the switch off."""
    rainbow = data.get("rainbow")
    if not isinstance(rainbow, dict) or "bcq" not in rainbow:
        return data
    rainbow = dict(rainbow)
    on = rainbow.pop("bcq")
    if on:
        rainbow["bcq_drop_threshold"] = rainbow.get("bcq_drop_threshold", 0.1)
    else:
        rainbow["bcq_drop_threshold"] = None
    logger.info(
        "%s: rainbow.bcq (Horizon) read as rainbow.bcq_drop_threshold=%s",
        source,
        rainbow["bcq_drop_threshold"],
    )
    return {**data, "rainbow": rainbow}


def _check_workflow_kind(data: dict[str, Any], cls: type[BaseModel], source: str) -> None:
    # A config meant for another workflow would otherwise surface as a confusing
    # "unknown key: actions"; say what happened instead.
    from reagent_lite.kinds.registry import kind_names, resolve_kind, spec_of_config
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
        f"{other.command}, or make it a {mine.name} config ({mine.command}) "
        f"(got {_show(data.get('workflow', other.name))})"
    )


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
            msg = "unknown key" + _suggest(loc, cls)
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _show(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
