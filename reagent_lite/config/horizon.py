"""Horizon-era configs: keys Horizon's workflows wrote, mapped onto ours or refused.

Keys that have no effect here are accepted, removed and logged as a WARNING naming the key
(never silently); those that would change behaviour we do not implement (e.g.
`"categorical": true`) are errors; renamed ones (`use_layer_norm`, `in_training_cpe`,
`rainbow.bcq`) are mapped and logged at INFO. `config.schema` reads the same tables, so
the JSON Schema accepts exactly what the migration does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from reagent_lite.config.json_text import show as _show
from reagent_lite.errors import ConfigError

logger = logging.getLogger("reagent_lite.config")

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
                value = False if value is None else value
                if new not in obj:
                    obj[new] = value
                elif obj[new] != value:
                    where = f"{obj_path}.{new}"
                    old_where = f"{obj_path}.{old}"
                    problems.append(_given_twice(source, where, old_where, value, obj[new]))
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


def _given_twice(source: str, where: str, horizon_name: str, old: Any, new: Any) -> str:
    # Horizon's name and ours for one setting are one key given twice: neither silently wins.
    return (
        f"{source}: {where}: given twice, as {horizon_name} (Horizon's name, meaning "
        f"{_show(old)}) and as {where} (got {_show(new)}); keep one"
    )


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
