"""Experiment tracking in MLflow (the `mlflow` extra), when the config has an `mlflow` block.

Rank 0 only (through `MetricsWriter`): the resolved config as params (dotted keys), every
numeric field of every `metrics.jsonl` record as a metric at its optimizer step (nested
CPE figures as `cpe/<estimator>/<field>`), and once the outputs are written the output
directory as artifacts under `model/` — without `checkpoints/`, which are for `--resume`,
not for people. The MLflow run ends FINISHED after the outputs, FAILED otherwise.

Tracking never stops training: a store that cannot be reached or written — at setup or
mid-run (a read-only filesystem, a full disk, a server gone) — gives one warning naming
the store and the error, and the run goes on untracked.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from reagent_lite.config.models import BaseWorkflowConfig, MlflowParameters
from reagent_lite.errors import ConfigError

log = logging.getLogger(__name__)

# MLflow caps a param value's length; longer values (layer lists...) are cut, not refused.
_MAX_PARAM = 500
_T = TypeVar("_T")


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
    """One MLflow run for one training run (see the module notes on failures)."""

    def __init__(self, settings: MlflowParameters, cfg: BaseWorkflowConfig) -> None:
        try:
            import mlflow
        except ImportError as err:
            raise ConfigError(
                f"mlflow: needs the mlflow package: pip install 'reagent-lite[mlflow]' ({err})"
            ) from None
        self._mlflow = mlflow
        self.store = settings.tracking_uri or "MLflow's default store"
        self._failed = False
        self._outputs_logged = False
        self.run = self._guarded("starting a run", lambda: self._start(settings, cfg))

    def _start(self, settings: MlflowParameters, cfg: BaseWorkflowConfig) -> Any:
        mlflow = self._mlflow
        if settings.tracking_uri:
            mlflow.set_tracking_uri(settings.tracking_uri)
        self.store = mlflow.get_tracking_uri()
        mlflow.set_experiment(settings.experiment_name)
        run = mlflow.start_run(run_name=settings.run_name)
        config = cfg.model_dump(mode="json")
        mlflow.log_params(
            {
                k: json.dumps(v)[:_MAX_PARAM] if not isinstance(v, str) else v[:_MAX_PARAM]
                for k, v in flatten(config, sep=".")
            }
        )
        log.info(
            "mlflow: run %s in experiment %r (%s)",
            run.info.run_id,
            settings.experiment_name,
            self.store,
        )
        return run

    def _guarded(self, what: str, call: Callable[[], _T]) -> _T | None:
        """`call()`, unless tracking failed before; a failure (of any kind: the store's
        errors are OSErrors, MlflowExceptions, HTTP errors...) warns once and ends
        tracking for this run, never the run."""
        if self._failed:
            return None
        try:
            return call()
        except Exception as err:  # any kind: see the docstring
            self._failed = True
            log.warning(
                "mlflow: %s failed on the tracking store %s (%s: %s); training goes on "
                "without tracking",
                what,
                self.store,
                type(err).__name__,
                err,
            )
            return None

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
            step = int(record.get("steps", 0))
            self._guarded("log_metrics", lambda: self._mlflow.log_metrics(metrics, step=step))

    def log_outputs(self, output_dir: Path) -> None:
        def log_all() -> None:
            for path in sorted(output_dir.iterdir()):
                if path.name == "checkpoints" or path.name.startswith("."):
                    continue
                if path.is_dir():
                    self._mlflow.log_artifacts(str(path), artifact_path=f"model/{path.name}")
                else:
                    self._mlflow.log_artifact(str(path), artifact_path="model")
            self._outputs_logged = True

        self._guarded("logging the outputs", log_all)

    def close(self) -> None:
        status = "FINISHED" if self._outputs_logged else "FAILED"
        self._guarded("ending the run", lambda: self._mlflow.end_run(status=status))
        if self._failed:  # end it locally too, so that a later run starts afresh
            try:
                self._mlflow.end_run(status="FAILED")
            except Exception:  # the store was reported broken already
                log.debug("mlflow: ending the run failed again", exc_info=True)
