"""What a workflow kind is: everything that differs between dqn and parametric_dqn.

The shared code — the loop, ingest, CPE, export, the online check — asks a `Kind` and
never branches on a kind's name. A kind declares:

* its data: the schema its tables are validated against and the layout they are
  ingested into (`data/ingest.py`: resident shards, windows from disk, eval tables), the
  feature space the ranks agree on, the samples normalization is fitted on, the training
  tensors (`Rows` columns) a shard becomes;
* its networks and maths: the Q-network, the trainer, Q over the candidate set, the
  candidate mask and the index of the logged action (what CPE reads);
* its served model: the serving module (preprocessing inside), example inputs, dynamic
  shapes and the signature written into `model_meta.json`; a greedy actor for online
  rollouts in a gymnasium environment.

Adding a kind means one module with a subclass of `Kind` (and its `FeatureSpace`
extension), registered with one `register_kind` call (`kinds/registry.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn
from typing_extensions import TypeVar

from reagent_lite.config.models import BaseWorkflowConfig
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.ingest import Layout, ingest
from reagent_lite.data.prepared import PreparedUnits, prepared_root
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.rows import Rows
from reagent_lite.data.schema import Field, TableSchema
from reagent_lite.data.shard_builder import IngestedShard
from reagent_lite.data.windows import load_units, stream_units
from reagent_lite.distributed.context import DistContext
from reagent_lite.distributed.threads import cores_per_process
from reagent_lite.errors import DataError
from reagent_lite.kinds.serving import Acting, NotServed
from reagent_lite.normalization.module import Preprocessor, one_intraop_thread
from reagent_lite.trainers.common import QLearningTrainer

C = TypeVar("C", bound=BaseWorkflowConfig)

# Columns only evaluation reads: never gathered or streamed for training steps.
EVAL_ONLY_FIELDS = ("propensity", "mdp_id", "sequence_number")
# A greedy policy over an environment's discrete actions: (states, presence), one row per
# environment, → one env action per row (the online check steps many episodes at once).
Actor = Callable[[Tensor, Tensor], list[int]]


@dataclass
class FeatureSpace:
    """Feature ids (in tensor order) agreed by every rank: the state's here; each kind
    extends it with what its actions need (`DiscreteSpace`, `ParametricSpace`)."""

    state_ids: list[str]

    def to_json(self) -> dict[str, Any]:
        """The space as `model_meta.json` and checkpoints hold it."""
        return {"state_feature_ids": self.state_ids}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The space `to_json` wrote (also read from a run's `model_meta.json`)."""
        return cls(state_ids=list(data["state_feature_ids"]))

    def ids(self, group: str) -> list[str]:
        """The feature ids a preprocessor group ("state"; a kind may add others) normalizes."""
        if group != "state":
            raise KeyError(f"{type(self).__name__} has no feature group {group!r}")
        return self.state_ids

    def q_outputs(self) -> int:
        """Q-values the network computes per row it is fed (memory estimate)."""
        return 1

    def rows_per_state(self) -> int:
        """Network rows per state: 1, or the padded candidates scored for it."""
        return 1


@dataclass
class DiscreteSpace(FeatureSpace):
    """A state's features and a fixed list of named actions (one Q-value each)."""

    actions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "actions": self.actions}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(state_ids=list(data["state_feature_ids"]), actions=list(data["actions"]))

    def q_outputs(self) -> int:
        return max(1, len(self.actions))


@dataclass
class ParametricSpace(FeatureSpace):
    """A state's features, the action features and the padded candidate-set size."""

    action_ids: list[str] = field(default_factory=list)
    max_candidates: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "action_feature_ids": self.action_ids,
            "max_candidates": self.max_candidates,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(
            state_ids=list(data["state_feature_ids"]),
            action_ids=list(data["action_feature_ids"]),
            max_candidates=int(data["max_candidates"]),
        )

    def ids(self, group: str) -> list[str]:
        return self.action_ids if group == "action" else super().ids(group)

    def rows_per_state(self) -> int:
        return max(1, self.max_candidates)


# The kind's feature space (a kind that names none reads only the state's ids).
S = TypeVar("S", bound=FeatureSpace, default=FeatureSpace)


def numeric_sorted(ids: set[str]) -> list[str]:
    return sorted(ids, key=lambda s: (int(s), s) if s.isdigit() else (1 << 62, s))


def agree_ids(ctx: DistContext, local: set[str]) -> list[str]:
    """The union of every rank's feature ids, in numeric order (the same on every rank)."""
    union: set[str] = set()
    for ids in ctx.all_gather_object(sorted(local)):
        union.update(ids)
    return numeric_sorted(union)


def sample_nan_rows(values: Tensor, n: int, seed: int) -> np.ndarray:
    """Up to n seeded rows of NaN-coded raw values [N, F] (normalization input); rows with
    no feature at all (padded candidates: not data) are never picked."""
    with one_intraop_thread():
        any_present = torch.empty(values.shape[0], dtype=torch.bool)
        step = 1 << 16  # bounds the [rows, F] temporaries
        for s in range(0, values.shape[0], step):
            any_present[s : s + step] = ~torch.isnan(values[s : s + step]).all(dim=1)
        keep = torch.nonzero(any_present).squeeze(1)
        if keep.shape[0] > n:
            gen = torch.Generator().manual_seed(seed)
            keep = keep[torch.randperm(keep.shape[0], generator=gen)[:n]]
        return values[keep].numpy().astype(np.float64)


class Kind(ABC, Generic[C, S]):
    """One workflow kind (see the module notes). Stateless: one instance serves every run."""

    name: ClassVar[str]
    # The kind's feature space S (what `agree_space` returns, `model_meta.json` holds).
    space_type: ClassVar[type[FeatureSpace]] = FeatureSpace
    # The fields its trainer reads from a batch (a Protocol): `training_tensors` holds them.
    batch_type: ClassVar[type]
    # The columns scoring with the served model reads (`predict`).
    scoring_fields: ClassVar[tuple[Field, ...]]
    # How the served model is called, for `model_meta.json`.
    signature: ClassVar[dict[str, Any]]

    # ------------------------------------------------------------------ data
    @abstractmethod
    def schema(self, cfg: C) -> TableSchema:
        """The columns of the kind's tables and the rules their rows obey (validation)."""

    @abstractmethod
    def layout(self, cfg: C, space: S | None = None) -> Layout[Any]:
        """How the kind's tables are ingested (`data/ingest.py`); with `space`, conformed
        to it (its ids first, ids outside it dropped, its K of candidates)."""

    @abstractmethod
    def agree_space(self, ctx: DistContext, cfg: C, shard: IngestedShard) -> S:
        """The feature space every rank agrees on, from what this rank's shard showed."""

    @abstractmethod
    def scan_space(self, ctx: DistContext, cfg: C, units: list[ShardPiece]) -> S:
        """The agreed feature space from a keys-only scan of the shard's units."""

    def norm_files(self, cfg: C) -> dict[str, str | None]:
        """Preprocessor group ("state", "action") → its configured normalization file; the
        state's here, a kind with more groups adds its own."""
        return {"state": cfg.state_norm_data_path}

    def norm_samples(self, shard: IngestedShard, n: int, seed: int) -> dict[str, np.ndarray]:
        """Up to n raw rows per preprocessor group, NaN = absent (what normalization fits);
        the state's here, a kind with more groups adds its own."""
        return {"state": sample_nan_rows(torch.from_numpy(shard.features["state"]), n, seed)}

    @abstractmethod
    def training_tensors(self, shard: IngestedShard, pre: dict[str, Preprocessor]) -> Rows:
        """The normalized columns training and evaluation read; the shard's feature arrays
        are normalized in place (its raw values are gone afterwards)."""

    def load_shard(
        self, ctx: DistContext, cfg: C, path: str, parts: list[tuple[int, int]]
    ) -> tuple[S, IngestedShard]:
        """This rank's shard (`parts`: the (rank, world) shards to lay end to end, normally
        one), ingested and conformed to the feature space the ranks agree on here."""
        shard = ingest(path, parts, self.layout(cfg))
        space = self.agree_space(ctx, cfg, shard)
        conform = self.layout(cfg, space).conform
        assert conform is not None
        conform(shard)
        return space, shard

    def load_window(self, cfg: C, space: S, units: Sequence[ShardPiece]) -> IngestedShard:
        """A window of units (`stream_from_disk`), ingested in `space`."""
        return load_units(units, self.layout(cfg, space))

    def load_table(self, cfg: C, space: S, path: str) -> IngestedShard:
        """A whole table (an eval table) in the training run's feature space: features the
        training data never had are ignored, candidate lists longer than its K are an error
        naming `path`, as are rows that break the kind's schema."""
        return ingest(path, [(0, 1)], self.layout(cfg, space))

    # ------------------------------------------------------------- networks
    @abstractmethod
    def build_q_network(self, cfg: C, dims: dict[str, int], space: S) -> nn.Module:
        """The Q-network; `dims`: the width of each preprocessor group's output."""

    def build_policy_network(self, cfg: C, dims: dict[str, int], space: S) -> nn.Module:
        """The network the run trains and exports: the Q-network, or what the config wraps
        around it (the dqn kind's BCQ imitation network); side models (CPE) are plain
        `build_q_network`s."""
        return self.build_q_network(cfg, dims, space)

    @abstractmethod
    def build_trainer(
        self, q_net: nn.Module, cfg: C, space: S, unwrapped: nn.Module
    ) -> QLearningTrainer[Any]:
        """The trainer of `q_net` (possibly a DDP wrapper around `unwrapped`)."""

    @abstractmethod
    def q_all(self, net: nn.Module, batch: Rows, *, next_state: bool) -> Tensor:
        """Q of every candidate [B, K] of the (next) state."""

    def candidate_mask(self, batch: Rows, *, next_state: bool) -> Tensor:
        """[B, K]: 1 where a candidate of the (next) state is possible (both kinds keep it
        in the same two columns)."""
        mask: Tensor = (
            batch.possible_next_actions_mask if next_state else batch.possible_actions_mask
        )
        return mask

    @abstractmethod
    def logged_index(self, batch: Rows) -> Tensor:
        """[B] int64: the logged action's index among the candidates (−1: not among them)."""

    # ---------------------------------------------------------------- serving
    @abstractmethod
    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        """Raw features in, Q out: what `model.pt2` holds."""

    @abstractmethod
    def example_inputs(self, space: S, batch: int = 3) -> tuple[Tensor, ...]:
        """Inputs of the serving module (export traces with them)."""

    @abstractmethod
    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        """The serving inputs' dynamic dimensions, for `torch.export`."""

    @abstractmethod
    def score_rows(
        self,
        program: Any,
        table: pa.Table,
        state: tuple[Tensor, Tensor],
        space: S,
        batch_size: int,
        source: str,
    ) -> pa.Table:
        """`table` with the served model's scores appended (`predict`); `state`: the
        table's state values and presence in `space`'s order."""

    @abstractmethod
    def greedy_actor(self, program: Any, space: S, n_env_actions: int) -> Actor:
        """The exported program as a greedy policy over an environment's actions."""

    # ---------------------------------------------------------- disk streaming
    def open_disk_sample(
        self, ctx: DistContext, cfg: C, path: str
    ) -> tuple[S, IngestedShard, list[ShardPiece]]:
        """`stream_from_disk`: the feature space (from a keys-only scan of the shard, agreed
        by the ranks), a raw sample of a few seeded row groups (normalization is fitted on
        it; normalized, it is the column template the step runner sizes its buffers from)
        and the shard's units (`data/disk_stream.py`) — no rank reads its whole shard."""
        units = stream_units(path, ctx.rank, ctx.world_size)
        if not units:
            raise DataError(
                f"{path}: rank {ctx.rank} of {ctx.world_size} has an empty shard "
                "(more ranks than rows?)"
            )
        space = self.scan_space(ctx, cfg, units)
        want = min(cfg.stream_window_rows, max(1, cfg.normalization_sample_size // ctx.world_size))
        order = np.random.default_rng([cfg.seed, ctx.rank, 1]).permutation(len(units))
        picked: list[ShardPiece] = []
        rows = 0
        for i in order:
            if rows >= want:
                break
            picked.append(units[int(i)])
            rows += units[int(i)].num_rows or 0
        return space, self.load_window(cfg, space, picked), units

    def disk_stream(
        self,
        ctx: DistContext,
        cfg: C,
        units: list[ShardPiece],
        space: S,
        pre: dict[str, Preprocessor],
    ) -> DiskShardStream:
        """The stream of training windows: each loaded, normalized in place and cut to the
        columns training reads, in a background thread (`DiskShardStream`); with
        `stream_prepare`, each row group once, then read back from its prepared arrays
        (`data/prepared.py`), the same windows bit for bit."""

        def load(window: Sequence[ShardPiece]) -> dict[str, Tensor]:
            data = self.training_tensors(self.load_window(cfg, space, window), pre)
            return {k: v for k, v in data.items() if k not in EVAL_ONLY_FIELDS}

        prepared = None
        if cfg.stream_prepare:
            settings = {
                "kind": self.name,
                "space": space.to_json(),
                "normalization": {
                    name: {f: p.model_dump(mode="json") for f, p in pr.params.items()}
                    for name, pr in pre.items()
                },
                "ingest": self.ingest_settings(cfg),
                "eval_only": list(EVAL_ONLY_FIELDS),
            }
            root = prepared_root(cfg.stream_prepared_dir)
            prepared = PreparedUnits(root, settings, lambda unit: load([unit]))
        return DiskShardStream(
            units,
            load if prepared is None else prepared.load,
            window_rows=cfg.stream_window_rows,
            read_ahead=cfg.stream_read_ahead,
            cores=cores_per_process(ctx.procs_per_node),
            seed=cfg.seed,
            rank=ctx.rank,
            prepared=prepared,
        )

    def ingest_settings(self, cfg: C) -> dict[str, Any]:
        """The config values `layout` reads besides the feature space, by their dotted
        paths: part of the key of prepared units (a test checks that `layout` reads
        nothing else)."""
        return {
            "drop_bad_rows": cfg.drop_bad_rows,
            "null_propensity": cfg.null_propensity,
            "rl.use_seq_num_diff_as_time_diff": cfg.rl.use_seq_num_diff_as_time_diff,
        }

    # ---------------------------------------------------------------- acting
    # The decision log's `action` column (its `possible_actions`: a list of it) for this
    # kind's served decisions; None: the kind's models are scored (`predict`), not served.
    log_action: ClassVar[pa.DataType | None] = None

    def acting(self, space: S) -> Acting:
        """How a served model of this kind acts on requests (`kinds/serving.py`); a
        `ConfigError` for a kind that is not served (`log_action` None)."""
        raise NotServed(self.name)
