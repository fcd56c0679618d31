"""What setup built for a run, as one frozen record the epoch-end, checkpoint and resume
code read (`Workflow.setup` builds it; nothing replaces its fields afterwards). The
networks, optimizer and CPE models are updated in place by the optimizer steps; what the
run carries between epochs is `state.TrainState`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from reagent_lite.config import WorkflowConfig
from reagent_lite.data.rows import Rows
from reagent_lite.distributed.context import DistContext
from reagent_lite.evaluation.cpe_models import CpeModelTrainer, CpeNets, EvaluatedPolicy
from reagent_lite.kinds import FeatureSpace, Kind
from reagent_lite.trainers.common import QLearningTrainer
from reagent_lite.training.inputs import Fingerprint
from reagent_lite.training.metrics import MetricsWriter


@dataclass(frozen=True)
class Run:
    kind: Kind[Any]
    cfg: WorkflowConfig
    ctx: DistContext
    run_id: str
    inputs: Fingerprint  # the files it trains on, as its checkpoints record them
    output_dir: Path
    space: FeatureSpace
    q_net: nn.Module  # the plain network (not its DDP/DataParallel wrapper)
    trainer: QLearningTrainer[Any]
    cpe: CpeModelTrainer | None
    cpe_nets: CpeNets | None
    cpe_policy: EvaluatedPolicy
    eval_data: Rows | None  # rank 0's, on the device; None elsewhere or without
    probe: Rows  # the states the divergence check scores (divergence.py)
    q_bound: float | None  # the largest |Q| the rewards allow (divergence.py)
    metrics: MetricsWriter | None  # rank 0's metrics.jsonl (and trackers)

    @property
    def config_json(self) -> dict[str, Any]:
        """The resolved config as JSON, as checkpoints record it."""
        return self.cfg.model_dump(mode="json")
