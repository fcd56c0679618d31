"""The servable outputs of a run, written by rank 0, each file atomically.

`write_outputs` reads a finished run as a frozen `RunResult` (what the loop hands over),
never the loop itself. `model.pt2` is a `torch.export` program with preprocessing inside
and a dynamic batch dimension (the kind says which inputs and dimensions);
`model_meta.json` is written last, so its presence marks a complete output.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reagent_lite.config import WorkflowConfig
from reagent_lite.evaluation.cpe_models import EvaluatedPolicy
from reagent_lite.io_utils import (
    atomic_write_bytes,
    atomic_write_json,
    check_owner,
    file_sha256,
    fsync_path,
    serialized,
)
from reagent_lite.kinds import FeatureSpace, Kind
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.normalization.params import NormalizationParameters, save_normalization
from reagent_lite.version import __version__

log = logging.getLogger("reagent_lite")


@dataclass(frozen=True)
class RunResult:
    """A finished run, as export reads it."""

    kind: Kind[Any]
    cfg: WorkflowConfig
    space: FeatureSpace
    norm: Mapping[str, Mapping[str, NormalizationParameters]]
    pre: Mapping[str, Preprocessor]
    q_net: nn.Module  # the selected epoch's network, on the CPU, in eval mode
    selected_epoch: int
    history: Sequence[Mapping[str, Any]]  # rank 0's per-epoch records
    world_size: int
    run_id: str = ""  # the run that trained it (ownership.py)


def export_program(serving: nn.Module, kind: Kind[Any], space: FeatureSpace) -> Any:
    """`serving` as a `torch.export` program with the kind's dynamic dimensions, checked
    against the eager module on the kind's example inputs."""
    inputs = kind.example_inputs(space)
    # Non-strict: no Dynamo, so models export their eager form (`models.mlp.compiling`).
    program = torch.export.export(
        serving.eval(), inputs, dynamic_shapes=kind.dynamic_shapes(), strict=False
    )
    got = program.module()(*inputs)
    want = serving(*inputs)
    if not torch.allclose(got, want, atol=1e-5, equal_nan=True):
        raise RuntimeError("exported program disagrees with the eager model")  # our bug, not input
    return program


def config_hash(resolved: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()


def write_outputs(run: RunResult) -> tuple[Path, dict[str, Any] | None]:
    """Writes the model files into `model_output_path`; returns the model's path and the
    online check's result (None when the config asks for none)."""
    out = Path(run.cfg.model_output_path)
    out.mkdir(parents=True, exist_ok=True)
    kind, space = run.kind, run.space
    pre = {name: copy.deepcopy(p).cpu().eval() for name, p in run.pre.items()}
    serving = kind.serving_module(pre, run.q_net).eval()
    with torch.no_grad():
        program = export_program(serving, kind, space)

    # The model files of one run appear together or not at all: model_meta.json marks a
    # complete set (predict requires it and checks model.pt2's digest against it), so the
    # previous run's goes first and this run's comes last.
    meta_path = out / "model_meta.json"
    check_owner(meta_path)  # never remove another run's meta: this run may have lost `out`
    meta_path.unlink(missing_ok=True)
    fsync_path(out)
    resolved = run.cfg.model_dump(mode="json")
    atomic_write_json(out / "config.json", resolved)
    for name, params in run.norm.items():
        save_normalization(out / _norm_file(name), dict(params))
    state = {"q_net": run.q_net.state_dict()}
    atomic_write_bytes(out / "model_state.pt", serialized(lambda buf: torch.save(state, buf)))
    model_path = out / "model.pt2"
    atomic_write_bytes(model_path, serialized(lambda buf: torch.export.save(program, buf)))

    final = dict(run.history[-1]) if run.history else {}
    online = _online_check(run, model_path)
    meta: dict[str, Any] = {
        "workflow": kind.name,
        "reagent_lite_version": __version__,
        "torch_version": torch.__version__,
        **space.to_json(),
        "signature": kind.signature,
        "normalization": {
            name: {fid: p.model_dump(mode="json") for fid, p in params.items()}
            for name, params in run.norm.items()
        },
        "config_hash": config_hash(resolved),
        "run_id": run.run_id,
        "model_sha256": file_sha256(model_path),
        "selected_epoch": run.selected_epoch,
        "model_selection": run.cfg.evaluation.model_selection,
        # Which policy the CPE figures in final_metrics (and metrics.jsonl) describe.
        "cpe_policy": _cpe_policy(run.cfg),
        "world_size": run.world_size,
        "final_metrics": final,
        "online_evaluation": online,
        "sample_data": resolved.get("sample_data"),
    }
    atomic_write_json(meta_path, meta)
    log.info(
        "model written to %s (epoch %d selected; the files count epochs from 0: "
        "selected_epoch %d in model_meta.json)",
        model_path,
        run.selected_epoch + 1,
        run.selected_epoch,
    )
    return model_path, online


def _cpe_policy(cfg: WorkflowConfig) -> dict[str, Any] | None:
    if not cfg.evaluation.calc_cpe_in_training or not cfg.eval_data_path:
        return None
    return EvaluatedPolicy(cfg.evaluation.policy, cfg.rl.temperature).describe()


def _norm_file(group: str) -> str:
    return "normalization.json" if group == "state" else f"normalization_{group}.json"


def _online_check(run: RunResult, model_path: Path) -> dict[str, Any] | None:
    cfg = run.cfg
    episodes = cfg.evaluation.online_episodes
    sample = cfg.sample_data
    if not episodes or sample is None or sample.kind != "gym":
        return None
    from reagent_lite.evaluation.online import rollout_exported_model

    result = rollout_exported_model(
        model_path,
        env_id=sample.env,
        episodes=episodes,
        seed=cfg.seed + 10_000,
        kind=run.kind,
        space=run.space,
    )
    log.info(
        "online check in %s: mean return %.1f over %d episodes",
        sample.env,
        result["mean_return"],
        episodes,
    )
    return result
