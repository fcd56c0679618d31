"""The parametric_dqn kind: actions are feature vectors; Q(s, a) scores each candidate of a
padded candidate set [B, K, G] with a mask [B, K]."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from reagent_lite.config.models import ParametricDQNWorkflowConfig
from reagent_lite.data.arrow import is_feature_map, list_lengths
from reagent_lite.data.checks import candidate_problems, feature_problems, null_rows
from reagent_lite.data.ingest import Layout
from reagent_lite.data.parametric_shard import (
    CANDIDATE_COLUMNS,
    PARAMETRIC_FIELDS,
    ParametricShard,
    ParametricShardBuilder,
)
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.rows import Rows
from reagent_lite.data.scatter import candidate_tensor
from reagent_lite.data.schema import (
    FEATURE_MAP,
    STATE_COLUMNS,
    Field,
    TableSchema,
    field,
    list_of,
    or_null,
    transition_schema,
)
from reagent_lite.data.scoring import CANDIDATES as CANDIDATES_FIELD
from reagent_lite.data.scoring import STATE as STATE_FIELD
from reagent_lite.data.scoring import run_batched, values_and_presence
from reagent_lite.data.shard_builder import IngestedShard
from reagent_lite.data.windows import scan_units
from reagent_lite.distributed.context import DistContext
from reagent_lite.kinds.base import Actor, Kind, ParametricSpace, agree_ids, sample_nan_rows
from reagent_lite.kinds.serving import Acting, Choice, Offered, RequestError, feature_row
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.trainers.parametric_dqn import ParametricBatch, ParametricDQNTrainer

_Cfg = ParametricDQNWorkflowConfig

# A parametric table: actions and candidates are feature maps.
PARAMETRIC_SCHEMA = transition_schema(
    "parametric_dqn",
    [
        field("action", is_feature_map, FEATURE_MAP, null_rows("no action (null map)"),
              feature_problems),
        field("next_action", or_null(is_feature_map), FEATURE_MAP, feature_problems),
        field("possible_actions", list_of(is_feature_map), f"lists of {FEATURE_MAP}",
              candidate_problems),
        field("possible_next_actions", list_of(is_feature_map), f"lists of {FEATURE_MAP}",
              candidate_problems),
    ],
)  # fmt: skip


class ParametricKind(Kind[ParametricDQNWorkflowConfig, ParametricSpace]):
    name = "parametric_dqn"
    space_type = ParametricSpace
    batch_type = ParametricBatch
    scoring_fields: ClassVar[tuple[Field, ...]] = (STATE_FIELD, CANDIDATES_FIELD)
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
    # The chosen candidate's feature map (its `possible_actions`: the candidates offered).
    log_action: ClassVar[pa.DataType] = pa.map_(pa.string(), pa.float64())

    # ------------------------------------------------------------------ data
    def schema(self, cfg: _Cfg) -> TableSchema:
        return PARAMETRIC_SCHEMA

    def layout(self, cfg: _Cfg, space: ParametricSpace | None = None) -> Layout[ParametricShard]:
        state_ids = space.state_ids if space is not None else []
        action_ids = space.action_ids if space is not None else []
        k = space.max_candidates if space is not None else cfg.max_candidates

        def builder(capacity: int | None, source: str) -> ParametricShardBuilder:
            return ParametricShardBuilder(
                capacity=capacity,
                max_candidates=k,
                use_seq_num_diff_as_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
                source=source,
                state_feature_ids=state_ids,
                action_feature_ids=action_ids,
            )

        def conform(shard: ParametricShard) -> None:
            assert k is not None
            shard.conform(state_ids, action_ids, k)

        return Layout(
            self.schema(cfg),
            builder,
            conform if space is not None else None,
            cfg.drop_bad_rows,
            null_propensity_as_one=cfg.null_propensity == "one",
        )

    def agree_space(self, ctx: DistContext, cfg: _Cfg, shard: IngestedShard) -> ParametricSpace:
        assert isinstance(shard, ParametricShard)
        return ParametricSpace(
            state_ids=agree_ids(ctx, shard.state_ids),
            action_ids=agree_ids(ctx, shard.action_ids),
            max_candidates=cfg.max_candidates or max(ctx.all_gather_object(shard.max_candidates)),
        )

    def scan_space(self, ctx: DistContext, cfg: _Cfg, units: list[ShardPiece]) -> ParametricSpace:
        lists = () if cfg.max_candidates else CANDIDATE_COLUMNS
        ids, longest = scan_units(units, {"state": STATE_COLUMNS, "action": ("action",)}, lists)
        return ParametricSpace(
            state_ids=agree_ids(ctx, ids["state"]),
            action_ids=agree_ids(ctx, ids["action"]),
            max_candidates=cfg.max_candidates or max(ctx.all_gather_object(longest)),
        )

    def norm_files(self, cfg: _Cfg) -> dict[str, str | None]:
        return {**super().norm_files(cfg), "action": cfg.action_norm_data_path}

    def norm_samples(self, shard: IngestedShard, n: int, seed: int) -> dict[str, np.ndarray]:
        cands = torch.from_numpy(shard.features["possible_actions"])
        return {
            **super().norm_samples(shard, n, seed),
            "action": sample_nan_rows(cands.reshape(-1, cands.shape[-1]), n, seed + 1),
        }

    def training_tensors(self, shard: IngestedShard, pre: dict[str, Preprocessor]) -> Rows:
        # Normalized in place (rows of [N, K, G] candidates as [N·K, G]): the raw values are
        # not needed after this.
        data = {k: torch.from_numpy(v) for k, v in {**shard.features, **shard.fields}.items()}
        for name in shard.features:
            p = pre["state"] if name in ("state", "next_state") else pre["action"]
            v = data[name]
            data[name] = p.normalize_rows(v.reshape(-1, v.shape[-1])).reshape(
                *v.shape[:-1], p.out_dim
            )
        shard.features = {}
        return Rows({k: data[k] for k in PARAMETRIC_FIELDS})

    # ------------------------------------------------------------- networks
    def build_q_network(self, cfg: _Cfg, dims: dict[str, int], space: ParametricSpace) -> nn.Module:
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
        self, q_net: nn.Module, cfg: _Cfg, space: ParametricSpace, unwrapped: nn.Module
    ) -> ParametricDQNTrainer:
        return ParametricDQNTrainer.from_config(q_net, cfg, unwrapped=unwrapped)

    def q_all(self, net: nn.Module, batch: Rows, *, next_state: bool) -> Tensor:
        if next_state:
            out: Tensor = net(batch.next_state, batch.possible_next_actions)
        else:
            out = net(batch.state, batch.possible_actions)
        return out

    def logged_index(self, batch: Rows) -> Tensor:
        index: Tensor = batch.action_index
        return index

    # ---------------------------------------------------------------- serving
    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return ParametricServingModule(pre["state"], pre["action"], q_net)

    def example_inputs(self, space: ParametricSpace, batch: int = 3) -> tuple[Tensor, ...]:
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

    def score_rows(
        self,
        program: Any,
        table: pa.Table,
        state: tuple[Tensor, Tensor],
        space: ParametricSpace,
        batch_size: int,
        source: str,
    ) -> pa.Table:
        """Adds `candidate_scores` (one per entry of `possible_actions`),
        `ranked_candidates` (indices, best first) and `best_candidate`."""
        col = table.column("possible_actions")
        if pa.types.is_null(col.type):  # JSON Lines with no candidate anywhere: empty lists
            col = pa.chunked_array([pa.array([[]] * len(col), type=pa.list_(pa.null()))])
        k = max(1, int(list_lengths(col).max())) if len(col) else 1
        raw, mask = candidate_tensor(col, space.action_ids, k, source)
        inputs = (*state, *values_and_presence(raw), torch.from_numpy(mask))
        parts = run_batched(program, inputs, batch_size)
        scores = torch.cat(parts).numpy() if parts else np.zeros((0, k), np.float32)
        lengths = mask.sum(axis=1).astype(np.int64)
        order = np.argsort(-scores, axis=1, kind="stable")
        ranked = [order[i, : lengths[i]].tolist() for i in range(len(order))]
        per_row = [scores[i, : lengths[i]].tolist() for i in range(len(scores))]
        return (
            table.append_column("candidate_scores", pa.array(per_row, type=pa.list_(pa.float32())))
            .append_column("ranked_candidates", pa.array(ranked, type=pa.list_(pa.int64())))
            .append_column(
                "best_candidate", pa.array([r[0] if r else None for r in ranked], type=pa.int64())
            )
        )

    def greedy_actor(self, program: Any, space: ParametricSpace, n_env_actions: int) -> Actor:
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

        def act(state: Tensor, state_presence: Tensor) -> list[int]:
            b = state.shape[0]
            q = program(
                state, state_presence, cand.expand(b, -1, -1), presence.expand(b, -1, -1),
                mask.expand(b, -1),
            )  # fmt: skip
            return [int(j) for j in q.argmax(dim=1).tolist()]

        return act

    def acting(self, space: ParametricSpace) -> CandidateActing:
        return CandidateActing(self.name, space.action_ids)


class CandidateActing(Acting):
    """Serving a model that scores candidates given as feature maps: a request must offer
    them, the response names the chosen one by its index, the log records the maps."""

    def __init__(self, kind: str, action_ids: Sequence[str]) -> None:
        self.kind, self.action_ids = kind, list(action_ids)
        self.column = {fid: j for j, fid in enumerate(self.action_ids)}

    def describe(self) -> dict[str, list[str]]:
        return {"action_feature_ids": self.action_ids}

    def choose(self, offered: Offered) -> Choice:
        if offered is None:
            raise RequestError(
                "possible_actions",
                f"required by a {self.kind} model (expected a list of candidate feature maps"
                f" with ids among {self.action_ids[:8]})",
            )
        maps = [a for a in offered if isinstance(a, Mapping)]
        if len(maps) != len(offered):
            raise RequestError(
                "possible_actions",
                f"a {self.kind} model takes candidate feature maps (feature id → number), not"
                " action names",
            )
        n = len(maps)
        return Choice(
            answers=list(range(n)),
            rank=np.arange(n),  # ties go to the first candidate
            logged=[{int(k): v for k, v in m.items()} for m in maps],
            inputs=np.stack([feature_row(m, self.column) for m in maps]),  # [n, G], NaN: absent
        )

    def q_values(
        self,
        program: Callable[..., Tensor],
        state: tuple[Tensor, Tensor],
        choices: Sequence[Choice],
    ) -> list[np.ndarray]:
        # The batch's candidate sets padded to the longest, the padding masked out.
        k = max(len(c.inputs) for c in choices)
        raw = np.full((len(choices), k, len(self.action_ids)), np.nan, np.float32)
        mask = np.zeros((len(choices), k), np.float32)
        for i, c in enumerate(choices):
            raw[i, : len(c.inputs)] = c.inputs
            mask[i, : len(c.inputs)] = 1.0
        q = program(*state, *values_and_presence(raw), torch.from_numpy(mask)).numpy()
        return [q[i, : len(c.inputs)] for i, c in enumerate(choices)]


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
        state = self.state_pre(state_values, state_presence)
        # Candidates stay [B, K, G] throughout: a reshape to [B·K, G] and back makes the
        # traced program tell B·K from B, a guard (K != 1) that refused one-candidate rows.
        actions = self.action_pre(action_values, action_presence)
        q: Tensor = self.q_net(state, actions)
        return torch.where(candidate_mask > 0, q, torch.full_like(q, float("-inf")))
