"""What differs between the dqn and parametric_dqn workflows, and nothing else.

The shared loop (`training/loop.py`) asks a kind to: find the feature space of a shard,
tensorize a table, normalize it into training tensors, build the Q-network and its
trainer, compute Q over the candidate set, and wrap the network for export. Everything
else — ranks, sampling, checkpoints, CPE, export files — is common.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from reagent_lite.data import tensorize as tz
from reagent_lite.data.disk_stream import (
    load_parametric_window,
    load_window,
    scan_state_ids,
    scan_units,
)
from reagent_lite.data.ingest import ingest_discrete
from reagent_lite.data.ingest_parametric import (
    CANDIDATE_COLUMNS,
    PARAMETRIC_FIELDS,
    ingest_parametric,
)
from reagent_lite.data.readers import ShardPiece
from reagent_lite.distributed.context import DistContext
from reagent_lite.models import build_q_network
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.normalization.module import Preprocessor, one_intraop_thread
from reagent_lite.trainers.dqn import DQNTrainer
from reagent_lite.trainers.parametric_dqn import ParametricDQNTrainer
from reagent_lite.training.streamed import (
    DiskStreaming,
    StreamedShard,
    ingest_opts,
    sample_nan_rows,
)
from reagent_lite.training.tensordict import TensorDict

# Rows normalized at a time: bounds the temporary memory of the preprocessing pass.
_NORM_CHUNK = 65_536


@dataclass
class FeatureSpace:
    """Feature ids (in tensor order) agreed by every rank."""

    state_ids: list[str]
    actions: list[str] = field(default_factory=list)  # dqn: action names
    action_ids: list[str] = field(default_factory=list)  # parametric: action feature ids
    max_candidates: int = 0  # parametric: padded candidate-set size

    def to_json(self) -> dict[str, Any]:
        return {
            "state_feature_ids": self.state_ids,
            "actions": self.actions,
            "action_feature_ids": self.action_ids,
            "max_candidates": self.max_candidates,
        }


def _numeric_sorted(ids: set[str]) -> list[str]:
    return sorted(ids, key=lambda s: (int(s), s) if s.isdigit() else (1 << 62, s))


def _agreed_ids(ctx: DistContext, table: pa.Table, column: str) -> list[str]:
    return _agree(ctx, set(tz.collect_feature_ids(table, column)))


def _agree(ctx: DistContext, local: set[str]) -> list[str]:
    union: set[str] = set()
    for ids in ctx.all_gather_object(sorted(local)):
        union.update(ids)
    return _numeric_sorted(union)


def _normalize(pre: Preprocessor, values: Tensor, presence: Tensor) -> Tensor:
    """Applies the preprocessor over leading dims in chunks (rows of [N, ..., F])."""
    lead = values.shape[:-1]
    flat_v = values.reshape(-1, values.shape[-1])
    flat_p = presence.reshape(-1, presence.shape[-1])
    out = torch.empty(flat_v.shape[0], pre.out_dim, dtype=torch.float32)
    with torch.no_grad(), one_intraop_thread():
        for start in range(0, flat_v.shape[0], _NORM_CHUNK):
            stop = start + _NORM_CHUNK
            out[start:stop] = pre(flat_v[start:stop], flat_p[start:stop])
    return out.reshape(*lead, pre.out_dim)


def _sample_rows(values: Tensor, presence: Tensor, n: int, seed: int) -> np.ndarray:
    """Up to n rows of raw values with NaN where a feature is absent (normalization input)."""
    flat_v = values.reshape(-1, values.shape[-1])
    flat_p = presence.reshape(-1, presence.shape[-1])
    keep = flat_p.sum(dim=1) > 0  # padded candidates are all-absent: not data
    flat_v, flat_p = flat_v[keep], flat_p[keep]
    if flat_v.shape[0] > n:
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randperm(flat_v.shape[0], generator=gen)[:n]
        flat_v, flat_p = flat_v[idx], flat_p[idx]
    sample = flat_v.numpy().astype(np.float64, copy=True)
    sample[flat_p.numpy() == 0] = np.nan
    return sample


class WorkflowKind(Protocol):
    name: str

    def feature_space(self, ctx: DistContext, table: pa.Table, cfg: Any) -> FeatureSpace: ...

    def tensorize(
        self, table: pa.Table, space: FeatureSpace, cfg: Any, source: str = "table"
    ) -> Any: ...

    def norm_samples(self, raw: Any, n: int, seed: int) -> dict[str, np.ndarray]: ...

    def training_tensors(self, raw: Any, pre: dict[str, Preprocessor]) -> TensorDict: ...

    def build_q_network(self, cfg: Any, dims: dict[str, int], space: FeatureSpace) -> nn.Module: ...

    def q_all(self, net: nn.Module, batch: TensorDict, *, next_state: bool) -> Tensor: ...

    def logged_index(self, batch: TensorDict) -> Tensor: ...

    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module: ...

    def candidate_mask(self, batch: TensorDict, *, next_state: bool) -> Tensor: ...

    def build_trainer(self, q_net: nn.Module, cfg: Any, unwrapped: nn.Module) -> Any: ...


class DiscreteKind(DiskStreaming):
    name = "dqn"

    def feature_space(self, ctx: DistContext, table: pa.Table, cfg: Any) -> FeatureSpace:
        return FeatureSpace(
            state_ids=_agreed_ids(ctx, table, "state_features"), actions=list(cfg.actions)
        )

    def tensorize(
        self, table: pa.Table, space: FeatureSpace, cfg: Any, source: str = "table"
    ) -> Any:
        return tz.tensorize_discrete(
            table,
            space.state_ids,
            space.actions,
            use_seq_num_diff_as_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            source=source,
        )

    def load_shard(
        self, ctx: DistContext, cfg: Any, path: str, parts: list[tuple[int, int]]
    ) -> tuple[FeatureSpace, StreamedShard, dict[str, float]]:
        """Streaming read + validate + tensorize of this rank's shard (`parts`: the (rank,
        world) shards to lay end to end, normally one); the feature ids are agreed here."""
        shard = ingest_discrete(path, parts, list(cfg.actions), **ingest_opts(cfg))
        space = FeatureSpace(state_ids=_agree(ctx, shard.state_ids), actions=list(cfg.actions))
        shard.reorder(space.state_ids)
        return space, StreamedShard.of(shard), shard.timings

    def _scan_space(self, ctx: DistContext, cfg: Any, units: list[ShardPiece]) -> FeatureSpace:
        return FeatureSpace(state_ids=_agree(ctx, scan_state_ids(units)), actions=list(cfg.actions))

    def _load_window(
        self, cfg: Any, space: FeatureSpace, units: Sequence[ShardPiece]
    ) -> StreamedShard:
        shard = load_window(units, space.actions, space.state_ids, **ingest_opts(cfg))
        return StreamedShard.of(shard)

    def norm_samples(self, raw: Any, n: int, seed: int) -> dict[str, np.ndarray]:
        if isinstance(raw, StreamedShard):
            return {"state": sample_nan_rows(raw.features["state"], n, seed)}
        return {"state": _sample_rows(raw.state, raw.state_presence, n, seed)}

    def training_tensors(self, raw: Any, pre: dict[str, Preprocessor]) -> TensorDict:
        state_pre = pre["state"]
        if isinstance(raw, StreamedShard):
            # Normalized in place: the raw values are not needed after this.
            data = {k: state_pre.normalize_rows(v) for k, v in raw.features.items()}
            raw.features = {}
            return TensorDict({**data, **raw.other})
        return TensorDict(
            {
                "state": _normalize(state_pre, raw.state, raw.state_presence),
                "next_state": _normalize(state_pre, raw.next_state, raw.next_state_presence),
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

    def build_q_network(self, cfg: Any, dims: dict[str, int], space: FeatureSpace) -> nn.Module:
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

    def q_all(self, net: nn.Module, batch: TensorDict, *, next_state: bool) -> Tensor:
        out: Tensor = net(batch.next_state if next_state else batch.state)
        return out

    def candidate_mask(self, batch: TensorDict, *, next_state: bool) -> Tensor:
        return batch.possible_next_actions_mask if next_state else batch.possible_actions_mask

    def logged_index(self, batch: TensorDict) -> Tensor:
        return batch.action

    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return DiscreteServingModule(pre["state"], q_net)

    def build_trainer(self, q_net: nn.Module, cfg: Any, unwrapped: nn.Module) -> Any:
        return DQNTrainer.from_config(q_net, cfg, unwrapped=unwrapped)


class ParametricKind(DiskStreaming):
    name = "parametric_dqn"

    def feature_space(self, ctx: DistContext, table: pa.Table, cfg: Any) -> FeatureSpace:
        state_ids = _agreed_ids(ctx, table, "state_features")
        action_ids = _agreed_ids(ctx, table, "action")
        k = max(ctx.all_gather_object(tz.max_candidates_in(table)))
        if cfg.max_candidates is not None:
            k = cfg.max_candidates
        return FeatureSpace(state_ids=state_ids, action_ids=action_ids, max_candidates=k)

    def tensorize(
        self, table: pa.Table, space: FeatureSpace, cfg: Any, source: str = "table"
    ) -> Any:
        return tz.tensorize_parametric(
            table,
            space.state_ids,
            space.action_ids,
            max_candidates=space.max_candidates,
            use_seq_num_diff_as_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            source=source,
        )

    def load_shard(
        self, ctx: DistContext, cfg: Any, path: str, parts: list[tuple[int, int]]
    ) -> tuple[FeatureSpace, StreamedShard, dict[str, float]]:
        """Streaming read + validate + tensorize of this rank's shard (as `DiscreteKind`);
        the feature ids and the candidate-set size are agreed here."""
        shard = ingest_parametric(
            path, parts, max_candidates=cfg.max_candidates, **ingest_opts(cfg)
        )
        k = cfg.max_candidates or max(ctx.all_gather_object(shard.max_candidates))
        space = FeatureSpace(
            state_ids=_agree(ctx, shard.state_ids),
            action_ids=_agree(ctx, shard.action_ids),
            max_candidates=k,
        )
        shard.conform(space.state_ids, space.action_ids, k)
        return space, StreamedShard.of(shard), shard.timings

    def _scan_space(self, ctx: DistContext, cfg: Any, units: list[ShardPiece]) -> FeatureSpace:
        lists = () if cfg.max_candidates else CANDIDATE_COLUMNS
        ids, longest = scan_units(units, {"state": tz.STATE_COLUMNS, "action": ("action",)}, lists)
        return FeatureSpace(
            state_ids=_agree(ctx, ids["state"]),
            action_ids=_agree(ctx, ids["action"]),
            max_candidates=cfg.max_candidates or max(ctx.all_gather_object(longest)),
        )

    def _load_window(
        self, cfg: Any, space: FeatureSpace, units: Sequence[ShardPiece]
    ) -> StreamedShard:
        shard = load_parametric_window(
            units, space.state_ids, space.action_ids, space.max_candidates, **ingest_opts(cfg)
        )
        return StreamedShard.of(shard)

    def norm_samples(self, raw: Any, n: int, seed: int) -> dict[str, np.ndarray]:
        if isinstance(raw, StreamedShard):
            cands = raw.features["possible_actions"]
            return {
                "state": sample_nan_rows(raw.features["state"], n, seed),
                "action": sample_nan_rows(cands.reshape(-1, cands.shape[-1]), n, seed + 1),
            }
        return {
            "state": _sample_rows(raw.state, raw.state_presence, n, seed),
            "action": _sample_rows(
                raw.possible_actions, raw.possible_actions_presence, n, seed + 1
            ),
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
                "state": _normalize(s, raw.state, raw.state_presence),
                "next_state": _normalize(s, raw.next_state, raw.next_state_presence),
                "action": _normalize(a, raw.action, raw.action_presence),
                "next_action": _normalize(a, raw.next_action, raw.next_action_presence),
                "possible_actions": _normalize(
                    a, raw.possible_actions, raw.possible_actions_presence
                ),
                "possible_actions_mask": raw.possible_actions_mask,
                "possible_next_actions": _normalize(
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

    def build_q_network(self, cfg: Any, dims: dict[str, int], space: FeatureSpace) -> nn.Module:
        t = cfg.training
        return ParametricQNetwork(
            state_dim=dims["state"],
            action_dim=dims["action"],
            layers=list(t.layers),
            activations=list(t.activations),
            dropout_ratio=t.dropout_ratio,
            layer_norm=t.layer_norm,
        )

    def q_all(self, net: nn.Module, batch: TensorDict, *, next_state: bool) -> Tensor:
        if next_state:
            out: Tensor = net(batch.next_state, batch.possible_next_actions)
        else:
            out = net(batch.state, batch.possible_actions)
        return out

    def candidate_mask(self, batch: TensorDict, *, next_state: bool) -> Tensor:
        return batch.possible_next_actions_mask if next_state else batch.possible_actions_mask

    def logged_index(self, batch: TensorDict) -> Tensor:
        return batch.action_index

    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return ParametricServingModule(pre["state"], pre["action"], q_net)

    def build_trainer(self, q_net: nn.Module, cfg: Any, unwrapped: nn.Module) -> Any:
        return ParametricDQNTrainer.from_config(q_net, cfg, unwrapped=unwrapped)


class DiscreteServingModule(nn.Module):
    """Raw feature values + presence in, Q for every action out (SPEC §5)."""

    def __init__(self, state_pre: Preprocessor, q_net: nn.Module):
        super().__init__()
        self.state_pre = state_pre
        self.q_net = q_net

    def forward(self, state_values: Tensor, state_presence: Tensor) -> Tensor:
        out: Tensor = self.q_net(self.state_pre(state_values, state_presence))
        return out


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


KINDS: dict[str, WorkflowKind] = {"dqn": DiscreteKind(), "parametric_dqn": ParametricKind()}
