"""Experiment tracking in MLflow (the `mlflow` extra), when the config has an `mlflow` block.

Rank 0 only (through `MetricsWriter`): the resolved config as params (dotted keys), every
numeric field of every `metrics.jsonl` record as a metric at its optimizer step (nested
CPE figures as `cpe/<estimator>/<field>`), and once the outputs are written the output
directory as artifacts under `model/` — without `checkpoints/`, which are for `--resume`,
not for people. The MLflow run ends FINISHED after the outputs, FAILED otherwise.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from reagent_lite.config.models import BaseWorkflowConfig, MlflowParameters
from reagent_lite.errors import ConfigError

log = logging.getLogger(__name__)

# MLflow caps a param value's length; longer values (layer lists...) are cut, not refused.
_MAX_PARAM = 500


def flatten(record: dict[str, Any], prefix: str = "", sep: str = "/") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(flatten(value, f"{name}{sep}", sep))
        else:
            out.append((name, value))
    return out


class MlflowTracker:
    """One MLflow run for one training run."""

    def __init__(self, settings: MlflowParameters, cfg: BaseWorkflowConfig) -> None:
        try:
            import mlflow
        except ImportError as err:
            raise ConfigError(
                f"mlflow: needs the mlflow package: pip install 'reagent-lite[mlflow]' ({err})"
            ) from None
        self._mlflow = mlflow
        if settings.tracking_uri:
            mlflow.set_tracking_uri(settings.tracking_uri)
        mlflow.set_experiment(settings.experiment_name)
        self.run = mlflow.start_run(run_name=settings.run_name)
        config = cfg.model_dump(mode="json")
        mlflow.log_params(
            {
                k: json.dumps(v)[:_MAX_PARAM] if not isinstance(v, str) else v[:_MAX_PARAM]
                for k, v in flatten(config, sep=".")
            }
        )
        log.info(
            "mlflow: run %s in experiment %r (%s)",
            self.run.info.run_id,
            settings.experiment_name,
            mlflow.get_tracking_uri(),
        )
        self._outputs_logged = False

    def log_record(self, record: dict[str, Any]) -> None:
        metrics = {
            k: float(v)
            for k, v in flatten(record)
            if k not in ("epoch", "steps")
            and isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
        }
        if metrics:
            self._mlflow.log_metrics(metrics, step=int(record.get("steps", 0)))

    def log_outputs(self, output_dir: Path) -> None:
        for path in sorted(output_dir.iterdir()):
            if path.name == "checkpoints" or path.name.startswith("."):
                continue
            if path.is_dir():
                self._mlflow.log_artifacts(str(path), artifact_path=f"model/{path.name}")
            else:
                self._mlflow.log_artifact(str(path), artifact_path="model")
        self._outputs_logged = True

    def close(self) -> None:
        self._mlflow.end_run(status="FINISHED" if self._outputs_logged else "FAILED")
