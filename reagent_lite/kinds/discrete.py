"""The dqn kind: a discrete set of named actions; Q(s) scores all of them at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from reagent_lite.config import DQNWorkflowConfig
from reagent_lite.data import tensorize as tz
from reagent_lite.data.disk_stream import load_window, scan_state_ids
from reagent_lite.data.ingest import ingest_discrete
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
from reagent_lite.models import build_q_network
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.trainers.dqn import DQNTrainer


class DiscreteKind(Kind[DQNWorkflowConfig]):
    name = "dqn"
    signature: ClassVar[dict[str, Any]] = {
        "inputs": ["state_values [B,F]", "state_presence [B,F]"],
        "output": "q [B,A] in the order of 'actions'",
    }

    # ------------------------------------------------------------------ data
    def feature_space(
        self, ctx: DistContext, table: pa.Table, cfg: DQNWorkflowConfig
    ) -> FeatureSpace:
        ids = agree_ids(ctx, set(tz.collect_feature_ids(table, "state_features")))
        return FeatureSpace(state_ids=ids, actions=list(cfg.actions))

    def tensorize(
        self, table: pa.Table, space: FeatureSpace, cfg: DQNWorkflowConfig, source: str
    ) -> Any:
        return tz.tensorize_discrete(
            table,
            space.state_ids,
            space.actions,
            use_seq_num_diff_as_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            source=source,
        )

    def load_shard(
        self, ctx: DistContext, cfg: DQNWorkflowConfig, path: str, parts: list[tuple[int, int]]
    ) -> tuple[FeatureSpace, StreamedShard, dict[str, float]]:
        shard = ingest_discrete(path, parts, list(cfg.actions), **ingest_opts(cfg))
        space = FeatureSpace(state_ids=agree_ids(ctx, shard.state_ids), actions=list(cfg.actions))
        shard.reorder(space.state_ids)
        return space, StreamedShard.of(shard), shard.timings

    def scan_space(
        self, ctx: DistContext, cfg: DQNWorkflowConfig, units: list[ShardPiece]
    ) -> FeatureSpace:
        return FeatureSpace(
            state_ids=agree_ids(ctx, scan_state_ids(units)), actions=list(cfg.actions)
        )

    def load_window(
        self, cfg: DQNWorkflowConfig, space: FeatureSpace, units: Sequence[ShardPiece]
    ) -> StreamedShard:
        shard = load_window(units, space.actions, space.state_ids, **ingest_opts(cfg))
        return StreamedShard.of(shard)

    def action_names(self, cfg: DQNWorkflowConfig) -> list[str] | None:
        return list(cfg.actions)

    def norm_files(self, cfg: DQNWorkflowConfig) -> dict[str, str | None]:
        return {"state": cfg.state_norm_data_path}

    def norm_samples(self, raw: Any, n: int, seed: int) -> dict[str, np.ndarray]:
        if isinstance(raw, StreamedShard):
            return {"state": sample_nan_rows(raw.features["state"], n, seed)}
        return {"state": sample_rows(raw.state, raw.state_presence, n, seed)}

    def training_tensors(self, raw: Any, pre: dict[str, Preprocessor]) -> TensorDict:
        state_pre = pre["state"]
        if isinstance(raw, StreamedShard):
            # Normalized in place: the raw values are not needed after this.
            data = {k: state_pre.normalize_rows(v) for k, v in raw.features.items()}
            raw.features = {}
            return TensorDict({**data, **raw.other})
        return TensorDict(
            {
                "state": normalize_chunked(state_pre, raw.state, raw.state_presence),
                "next_state": normalize_chunked(state_pre, raw.next_state, raw.next_state_presence),
                "action": raw.action,
                "next_action": raw.next_action,
                "reward": raw.reward,
                "possible_actions_mask": raw.possible_actions_mask,
                "possible_next_actions_mask": raw.possible_next_actions_mask,
                "terminal": raw.terminal,
                "time_diff": raw.time_diff,
                "propensity": raw.propensity,
                "mdp_id": raw.mdp_id,
                "sequence_number": raw.sequence_number,
            }
        )

    # ------------------------------------------------------------- networks
    def build_q_network(
        self, cfg: DQNWorkflowConfig, dims: dict[str, int], space: FeatureSpace
    ) -> nn.Module:
        t = cfg.training
        return build_q_network(
            in_dim=dims["state"],
            n_actions=len(space.actions),
            layers=list(t.layers),
            activations=list(t.activations),
            dropout_ratio=t.dropout_ratio,
            layer_norm=t.layer_norm,
            dueling=cfg.rainbow.dueling_architecture,
        )

    def build_trainer(
        self, q_net: nn.Module, cfg: DQNWorkflowConfig, space: FeatureSpace, unwrapped: nn.Module
    ) -> DQNTrainer:
        return DQNTrainer.from_config(q_net, cfg, unwrapped=unwrapped)

    def q_all(self, net: nn.Module, batch: Any, *, next_state: bool) -> Tensor:
        out: Tensor = net(batch.next_state if next_state else batch.state)
        return out

    def candidate_mask(self, batch: Any, *, next_state: bool) -> Tensor:
        mask: Tensor = (
            batch.possible_next_actions_mask if next_state else batch.possible_actions_mask
        )
        return mask

    def logged_index(self, batch: Any) -> Tensor:
        index: Tensor = batch.action
        return index

    # ---------------------------------------------------------------- serving
    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return DiscreteServingModule(pre["state"], q_net)

    def example_inputs(self, space: FeatureSpace, batch: int = 3) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        n = len(space.state_ids)
        return (torch.randn(batch, n, generator=gen), torch.ones(batch, n))

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        batch = torch.export.Dim("batch", min=1, max=1 << 30)
        return {"state_values": {0: batch}, "state_presence": {0: batch}}

    def greedy_actor(self, program: Any, space: FeatureSpace, n_env_actions: int) -> Actor:
        # Action names that are integers name the environment's action; others go by position.
        env_action = [int(a) if a.isdigit() else i for i, a in enumerate(space.actions)]

        def act(state: Tensor, presence: Tensor) -> int:
            q = program(state, presence)
            return env_action[int(q.argmax(dim=1).item())]

        return act


class DiscreteServingModule(nn.Module):
    """Raw feature values + presence in, Q for every action out."""

    def __init__(self, state_pre: Preprocessor, q_net: nn.Module):
        super().__init__()
        self.state_pre = state_pre
        self.q_net = q_net

    def forward(self, state_values: Tensor, state_presence: Tensor) -> Tensor:
        out: Tensor = self.q_net(self.state_pre(state_values, state_presence))
        return out
