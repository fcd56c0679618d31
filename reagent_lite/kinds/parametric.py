"""The parametric_dqn kind: actions are feature vectors; Q(s, a) scores each candidate of a
padded candidate set [B, K, G] with a mask [B, K]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from reagent_lite.config import ParametricDQNWorkflowConfig
from reagent_lite.data import tensorize as tz
from reagent_lite.data.disk_stream import load_parametric_window, scan_units
from reagent_lite.data.ingest_parametric import (
    CANDIDATE_COLUMNS,
    PARAMETRIC_FIELDS,
    ingest_parametric,
)
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.tensordict import TensorDict
from reagent_lite.distributed.context import DistContext
from reagent_lite.kinds.base import (
    Actor,
    FeatureSpace,
    Kind,
    StreamedShard,
    agree_ids,
    ingest_opts,
    normalize_chunked,
    sample_nan_rows,
    sample_rows,
)
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.trainers.parametric_dqn import ParametricDQNTrainer

_Cfg = ParametricDQNWorkflowConfig


class ParametricKind(Kind[ParametricDQNWorkflowConfig]):
    name = "parametric_dqn"
    signature: ClassVar[dict[str, Any]] = {
        "inputs": [
            "state_values [B,F]",
            "state_presence [B,F]",
            "action_values [B,K,G]",
            "action_presence [B,K,G]",
            "candidate_mask [B,K]",
        ],
        "output": "q [B,K]; -inf where candidate_mask is 0",
    }

    # ------------------------------------------------------------------ data
    def feature_space(self, ctx: DistContext, table: pa.Table, cfg: _Cfg) -> FeatureSpace:
        state_ids = agree_ids(ctx, set(tz.collect_feature_ids(table, "state_features")))
        action_ids = agree_ids(ctx, set(tz.collect_feature_ids(table, "action")))
        k = max(ctx.all_gather_object(tz.max_candidates_in(table)))
        if cfg.max_candidates is not None:
            k = cfg.max_candidates
        return FeatureSpace(state_ids=state_ids, action_ids=action_ids, max_candidates=k)

    def tensorize(self, table: pa.Table, space: FeatureSpace, cfg: _Cfg, source: str) -> Any:
        return tz.tensorize_parametric(
            table,
            space.state_ids,
            space.action_ids,
            max_candidates=space.max_candidates,
            use_seq_num_diff_as_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            source=source,
        )

    def load_shard(
        self, ctx: DistContext, cfg: _Cfg, path: str, parts: list[tuple[int, int]]
    ) -> tuple[FeatureSpace, StreamedShard, dict[str, float]]:
        shard = ingest_parametric(
            path, parts, max_candidates=cfg.max_candidates, **ingest_opts(cfg)
        )
        k = cfg.max_candidates or max(ctx.all_gather_object(shard.max_candidates))
        space = FeatureSpace(
            state_ids=agree_ids(ctx, shard.state_ids),
            action_ids=agree_ids(ctx, shard.action_ids),
            max_candidates=k,
        )
        shard.conform(space.state_ids, space.action_ids, k)
        return space, StreamedShard.of(shard), shard.timings

    def scan_space(self, ctx: DistContext, cfg: _Cfg, units: list[ShardPiece]) -> FeatureSpace:
        lists = () if cfg.max_candidates else CANDIDATE_COLUMNS
        ids, longest = scan_units(units, {"state": tz.STATE_COLUMNS, "action": ("action",)}, lists)
        return FeatureSpace(
            state_ids=agree_ids(ctx, ids["state"]),
            action_ids=agree_ids(ctx, ids["action"]),
            max_candidates=cfg.max_candidates or max(ctx.all_gather_object(longest)),
        )

    def load_window(
        self, cfg: _Cfg, space: FeatureSpace, units: Sequence[ShardPiece]
    ) -> StreamedShard:
        shard = load_parametric_window(
            units, space.state_ids, space.action_ids, space.max_candidates, **ingest_opts(cfg)
        )
        return StreamedShard.of(shard)

    def action_names(self, cfg: _Cfg) -> list[str] | None:
        return None

    def norm_files(self, cfg: _Cfg) -> dict[str, str | None]:
        return {"state": cfg.state_norm_data_path, "action": cfg.action_norm_data_path}

    def norm_samples(self, raw: Any, n: int, seed: int) -> dict[str, np.ndarray]:
        if isinstance(raw, StreamedShard):
            cands = raw.features["possible_actions"]
            return {
                "state": sample_nan_rows(raw.features["state"], n, seed),
                "action": sample_nan_rows(cands.reshape(-1, cands.shape[-1]), n, seed + 1),
            }
        return {
            "state": sample_rows(raw.state, raw.state_presence, n, seed),
            "action": sample_rows(raw.possible_actions, raw.possible_actions_presence, n, seed + 1),
        }

    def training_tensors(self, raw: Any, pre: dict[str, Preprocessor]) -> TensorDict:
        s, a = pre["state"], pre["action"]
        if isinstance(raw, StreamedShard):
            # Normalized in place (rows of [N, K, G] candidates as [N·K, G]): the raw values
            # are not needed after this.
            data = {**raw.features, **raw.other}
            for name, v in raw.features.items():
                p = s if name in ("state", "next_state") else a
                data[name] = p.normalize_rows(v.reshape(-1, v.shape[-1])).reshape(
                    *v.shape[:-1], p.out_dim
                )
            raw.features = {}
            return TensorDict({k: data[k] for k in PARAMETRIC_FIELDS})
        return TensorDict(
            {
                "state": normalize_chunked(s, raw.state, raw.state_presence),
                "next_state": normalize_chunked(s, raw.next_state, raw.next_state_presence),
                "action": normalize_chunked(a, raw.action, raw.action_presence),
                "next_action": normalize_chunked(a, raw.next_action, raw.next_action_presence),
                "possible_actions": normalize_chunked(
                    a, raw.possible_actions, raw.possible_actions_presence
                ),
                "possible_actions_mask": raw.possible_actions_mask,
                "possible_next_actions": normalize_chunked(
                    a, raw.possible_next_actions, raw.possible_next_actions_presence
                ),
                "possible_next_actions_mask": raw.possible_next_actions_mask,
                "action_index": raw.action_index,
                "reward": raw.reward,
                "terminal": raw.terminal,
                "time_diff": raw.time_diff,
                "propensity": raw.propensity,
                "mdp_id": raw.mdp_id,
                "sequence_number": raw.sequence_number,
            }
        )

    # ------------------------------------------------------------- networks
    def build_q_network(self, cfg: _Cfg, dims: dict[str, int], space: FeatureSpace) -> nn.Module:
        t = cfg.training
        return ParametricQNetwork(
            state_dim=dims["state"],
            action_dim=dims["action"],
            layers=list(t.layers),
            activations=list(t.activations),
            dropout_ratio=t.dropout_ratio,
            layer_norm=t.layer_norm,
        )

    def build_trainer(
        self, q_net: nn.Module, cfg: _Cfg, space: FeatureSpace, unwrapped: nn.Module
    ) -> ParametricDQNTrainer:
        return ParametricDQNTrainer.from_config(q_net, cfg, unwrapped=unwrapped)

    def q_all(self, net: nn.Module, batch: Any, *, next_state: bool) -> Tensor:
        if next_state:
            out: Tensor = net(batch.next_state, batch.possible_next_actions)
        else:
            out = net(batch.state, batch.possible_actions)
        return out

    def candidate_mask(self, batch: Any, *, next_state: bool) -> Tensor:
        mask: Tensor = (
            batch.possible_next_actions_mask if next_state else batch.possible_actions_mask
        )
        return mask

    def logged_index(self, batch: Any) -> Tensor:
        index: Tensor = batch.action_index
        return index

    # ---------------------------------------------------------------- serving
    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return ParametricServingModule(pre["state"], pre["action"], q_net)

    def example_inputs(self, space: FeatureSpace, batch: int = 3) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        n, g = len(space.state_ids), len(space.action_ids)
        # At least two candidates: a traced size of 1 would be specialised away.
        k = max(space.max_candidates, 2)
        state = torch.randn(batch, n, generator=gen)
        actions = torch.randn(batch, k, g, generator=gen)
        return (
            state,
            torch.ones(batch, n),
            actions,
            torch.ones(batch, k, g),
            torch.ones(batch, k),
        )

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        batch = torch.export.Dim("batch", min=1, max=1 << 30)
        cand = torch.export.Dim("candidates", min=1, max=1 << 20)
        return {
            "state_values": {0: batch},
            "state_presence": {0: batch},
            "action_values": {0: batch, 1: cand},
            "action_presence": {0: batch, 1: cand},
            "candidate_mask": {0: batch, 1: cand},
        }

    def greedy_actor(self, program: Any, space: FeatureSpace, n_env_actions: int) -> Actor:
        from reagent_lite.samples.gym_logging import action_feature_map

        g = len(space.action_ids)
        cand = torch.zeros(1, n_env_actions, g)
        presence = torch.zeros_like(cand)
        column = {fid: j for j, fid in enumerate(space.action_ids)}
        for k in range(n_env_actions):
            for fid, value in action_feature_map(k, n_env_actions).items():
                if fid in column:
                    cand[0, k, column[fid]] = value
                    presence[0, k, column[fid]] = 1.0
        mask = torch.ones(1, n_env_actions)

        def act(state: Tensor, state_presence: Tensor) -> int:
            q = program(state, state_presence, cand, presence, mask)
            return int(q.argmax(dim=1).item())

        return act


class ParametricServingModule(nn.Module):
    """Raw state + padded raw candidates in, Q per candidate out; masked slots are -inf."""

    def __init__(self, state_pre: Preprocessor, action_pre: Preprocessor, q_net: nn.Module):
        super().__init__()
        self.state_pre = state_pre
        self.action_pre = action_pre
        self.q_net = q_net

    def forward(
        self,
        state_values: Tensor,
        state_presence: Tensor,
        action_values: Tensor,
        action_presence: Tensor,
        candidate_mask: Tensor,
    ) -> Tensor:
        b, k, g = action_values.shape
        state = self.state_pre(state_values, state_presence)
        actions = self.action_pre(
            action_values.reshape(b * k, g), action_presence.reshape(b * k, g)
        )
        q: Tensor = self.q_net(state, actions.reshape(b, k, -1))
        return torch.where(candidate_mask > 0, q, torch.full_like(q, float("-inf")))
