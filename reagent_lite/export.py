"""The servable outputs of a run (SPEC §5), written by rank 0, each file atomically.

`model.pt2` is a `torch.export` program with preprocessing inside and a dynamic batch
dimension; `model_meta.json` is written last, so its presence marks a complete output.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from reagent_lite import __version__
from reagent_lite.io_utils import atomic_write, atomic_write_json
from reagent_lite.normalization.params import save_normalization

if TYPE_CHECKING:
    from reagent_lite.training.loop import Workflow

log = logging.getLogger("reagent_lite")


def example_inputs(
    kind: str, n_state: int, n_action: int = 0, k: int = 0, batch: int = 3
) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    state = torch.randn(batch, n_state, generator=gen)
    presence = torch.ones(batch, n_state)
    if kind == "dqn":
        return (state, presence)
    actions = torch.randn(batch, k, n_action, generator=gen)
    return (state, presence, actions, torch.ones(batch, k, n_action), torch.ones(batch, k))


def export_program(serving: nn.Module, kind: str, inputs: tuple[Tensor, ...]) -> Any:
    batch = Dim("batch", min=1, max=1 << 30)
    if kind == "dqn":
        shapes: Any = {"state_values": {0: batch}, "state_presence": {0: batch}}
    else:
        cand = Dim("candidates", min=1, max=1 << 20)
        shapes = {
            "state_values": {0: batch},
            "state_presence": {0: batch},
            "action_values": {0: batch, 1: cand},
            "action_presence": {0: batch, 1: cand},
            "candidate_mask": {0: batch, 1: cand},
        }
    program = torch.export.export(serving.eval(), inputs, dynamic_shapes=shapes)
    got = program.module()(*inputs)
    want = serving(*inputs)
    if not torch.allclose(got, want, atol=1e-5, equal_nan=True):
        raise RuntimeError("exported program disagrees with the eager model")  # our bug, not input
    return program


def config_hash(resolved: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()


def write_outputs(wf: Workflow) -> Path:
    out = wf.output_dir
    out.mkdir(parents=True, exist_ok=True)
    kind = wf.kind.name
    q_net = wf.final_model()
    pre = {name: copy.deepcopy(p).cpu().eval() for name, p in wf.pre.items()}
    serving = wf.kind.serving_module(pre, q_net).eval()
    space = wf.space
    inputs = example_inputs(
        kind, len(space.state_ids), len(space.action_ids), max(space.max_candidates, 2)
    )
    with torch.no_grad():
        program = export_program(serving, kind, inputs)

    resolved = wf.cfg.model_dump(mode="json")
    atomic_write_json(out / "config.json", resolved)
    save_normalization(out / "normalization.json", wf.norm["state"])
    if "action" in wf.norm:
        save_normalization(out / "normalization_action.json", wf.norm["action"])
    atomic_write(out / "model_state.pt", lambda tmp: torch.save({"q_net": q_net.state_dict()}, tmp))
    model_path = out / "model.pt2"
    atomic_write(model_path, lambda tmp: torch.export.save(program, str(tmp)))

    final = wf.history[-1] if wf.history else {}
    online = _online_check(wf, model_path)
    meta: dict[str, Any] = {
        "workflow": kind,
        "reagent_lite_version": __version__,
        "torch_version": torch.__version__,
        **space.to_json(),
        "signature": _signature(kind),
        "normalization": {
            name: {fid: p.model_dump(mode="json") for fid, p in params.items()}
            for name, params in wf.norm.items()
        },
        "config_hash": config_hash(resolved),
        "selected_epoch": wf.best["epoch"],
        "model_selection": wf.cfg.evaluation.model_selection,
        "world_size": wf.ctx.world_size,
        "final_metrics": final,
        "online_evaluation": online,
        "sample_data": resolved.get("sample_data"),
    }
    atomic_write_json(out / "model_meta.json", meta)
    log.info(
        "model written to %s (epoch %d selected; the files count epochs from 0: "
        "selected_epoch %d in model_meta.json)",
        model_path,
        wf.best["epoch"] + 1,
        wf.best["epoch"],
    )
    return model_path


def _signature(kind: str) -> dict[str, Any]:
    if kind == "dqn":
        return {
            "inputs": ["state_values [B,F]", "state_presence [B,F]"],
            "output": "q [B,A] in the order of 'actions'",
        }
    return {
        "inputs": [
            "state_values [B,F]",
            "state_presence [B,F]",
            "action_values [B,K,G]",
            "action_presence [B,K,G]",
            "candidate_mask [B,K]",
        ],
        "output": "q [B,K]; -inf where candidate_mask is 0",
    }


def _online_check(wf: Workflow, model_path: Path) -> dict[str, Any] | None:
    cfg = wf.cfg
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
        kind=wf.kind.name,
        state_feature_ids=wf.space.state_ids,
        action_feature_ids=wf.space.action_ids,
        actions=wf.space.actions,
    )
    if wf.metrics is not None:
        wf.metrics.write({"epoch": wf.best["epoch"], "steps": wf.global_step, "online": result})
    log.info(
        "online check in %s: mean return %.1f over %d episodes",
        sample.env,
        result["mean_return"],
        episodes,
    )
    return result
