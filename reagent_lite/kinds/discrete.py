"""The dqn kind: a discrete set of named actions; Q(s) scores all of them at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.data.arrow import NAME_EMPTY, NAME_NULL, is_str, string_index
from reagent_lite.data.checks import Problems, Rule, name_rows
from reagent_lite.data.discrete_shard import DiscreteShard, DiscreteShardBuilder
from reagent_lite.data.ingest import Layout
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.rows import Rows
from reagent_lite.data.scatter import actions_mask
from reagent_lite.data.schema import (
    STATE_COLUMNS,
    Field,
    TableSchema,
    field,
    list_of,
    or_null,
    transition_schema,
)
from reagent_lite.data.scoring import STATE as STATE_FIELD
from reagent_lite.data.scoring import run_batched
from reagent_lite.data.shard_builder import IngestedShard
from reagent_lite.data.validate import ShardValidation
from reagent_lite.data.windows import scan_units
from reagent_lite.distributed.context import DistContext
from reagent_lite.kinds.base import Actor, DiscreteSpace, Kind, agree_ids
from reagent_lite.kinds.serving import Acting, Choice, Offered, RequestError
from reagent_lite.models import build_q_network
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.trainers.dqn import DiscreteBatch, DQNTrainer


class DiscreteKind(Kind[DQNWorkflowConfig, DiscreteSpace]):
    name = "dqn"
    space_type = DiscreteSpace
    batch_type = DiscreteBatch
    scoring_fields: ClassVar[tuple[Field, ...]] = (STATE_FIELD,)
    signature: ClassVar[dict[str, Any]] = {
        "inputs": ["state_values [B,F]", "state_presence [B,F]"],
        "output": "q [B,A] in the order of 'actions'",
    }
    log_action: ClassVar[pa.DataType] = pa.string()  # the chosen action's name

    # ------------------------------------------------------------------ data
    def schema(self, cfg: DQNWorkflowConfig) -> TableSchema:
        return dqn_schema(list(cfg.actions))

    def layout(
        self, cfg: DQNWorkflowConfig, space: DiscreteSpace | None = None
    ) -> Layout[DiscreteShard]:
        actions, ids = list(cfg.actions), space.state_ids if space is not None else []

        def builder(capacity: int | None, source: str) -> DiscreteShardBuilder:
            return DiscreteShardBuilder(
                actions,
                capacity=capacity,
                use_seq_num_diff_as_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
                source=source,
                feature_ids=ids,
            )

        def conform(shard: DiscreteShard) -> None:
            shard.reorder(ids)

        return Layout(
            self.schema(cfg),
            builder,
            conform if space is not None else None,
            cfg.drop_bad_rows,
            null_propensity_as_one=cfg.null_propensity == "one",
        )

    def agree_space(
        self, ctx: DistContext, cfg: DQNWorkflowConfig, shard: IngestedShard
    ) -> DiscreteSpace:
        return DiscreteSpace(state_ids=agree_ids(ctx, shard.state_ids), actions=list(cfg.actions))

    def scan_space(
        self, ctx: DistContext, cfg: DQNWorkflowConfig, units: list[ShardPiece]
    ) -> DiscreteSpace:
        ids = scan_units(units, {"state": STATE_COLUMNS})[0]["state"]
        return DiscreteSpace(state_ids=agree_ids(ctx, ids), actions=list(cfg.actions))

    def training_tensors(self, shard: IngestedShard, pre: dict[str, Preprocessor]) -> Rows:
        # Normalized in place: the raw values are not needed after this.
        state_pre = pre["state"]
        data = {k: state_pre.normalize_rows(torch.from_numpy(v)) for k, v in shard.features.items()}
        shard.features = {}
        return Rows({**data, **{k: torch.from_numpy(v) for k, v in shard.fields.items()}})

    # ------------------------------------------------------------- networks
    def build_q_network(
        self, cfg: DQNWorkflowConfig, dims: dict[str, int], space: DiscreteSpace
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

    def build_policy_network(
        self, cfg: DQNWorkflowConfig, dims: dict[str, int], space: DiscreteSpace
    ) -> nn.Module:
        q_net = self.build_q_network(cfg, dims, space)
        threshold = cfg.rainbow.bcq_drop_threshold
        # The CQL weight reads the logging policy off BCQ's imitator (threshold None: it
        # drops nothing).
        if threshold is None and cfg.training.cql_weighting == "constant":
            return q_net
        t = cfg.training
        # The imitation network: the Q-network's shape (never dueling), its own weights.
        imitator = build_q_network(
            in_dim=dims["state"],
            n_actions=len(space.actions),
            layers=list(t.layers),
            activations=list(t.activations),
            dropout_ratio=t.dropout_ratio,
            layer_norm=t.layer_norm,
        )
        return BCQQNetwork(q_net, imitator, threshold)

    def build_trainer(
        self, q_net: nn.Module, cfg: DQNWorkflowConfig, space: DiscreteSpace, unwrapped: nn.Module
    ) -> DQNTrainer:
        return DQNTrainer.from_config(q_net, cfg, unwrapped=unwrapped)

    def q_all(self, net: nn.Module, batch: Rows, *, next_state: bool) -> Tensor:
        out: Tensor = net(batch.next_state if next_state else batch.state)
        return out

    def logged_index(self, batch: Rows) -> Tensor:
        index: Tensor = batch.action
        return index

    # ---------------------------------------------------------------- serving
    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return DiscreteServingModule(pre["state"], q_net)

    def example_inputs(self, space: DiscreteSpace, batch: int = 3) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        n = len(space.state_ids)
        return (torch.randn(batch, n, generator=gen), torch.ones(batch, n))

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        batch = torch.export.Dim("batch", min=1, max=1 << 30)
        return {"state_values": {0: batch}, "state_presence": {0: batch}}

    def score_rows(
        self,
        program: Any,
        table: pa.Table,
        state: tuple[Tensor, Tensor],
        space: DiscreteSpace,
        batch_size: int,
        source: str,
    ) -> pa.Table:
        """Adds `q_values` (in the order of `actions`) and `best_action`: the best of the
        row's `possible_actions` when the table has that column (the policy CPE evaluates
        and the online check plays; ties to the first, as `torch.argmax`), null for a row
        whose candidate list is empty; the best of all actions without the column."""
        parts = run_batched(program, state, batch_size)
        q = torch.cat(parts).numpy() if parts else np.zeros((0, len(space.actions)), np.float32)
        actions = np.asarray(space.actions, dtype=object)
        mask = scored_candidates(table, space.actions, source)
        if mask is None:
            best = actions[q.argmax(axis=1)] if len(q) else np.asarray([], dtype=object)
        else:
            lowest = np.finfo(np.float32).min  # not −inf: a −inf Q must still be pickable
            choice = np.where(mask > 0, q, lowest).argmax(axis=1)
            best = np.where(mask.any(axis=1), actions[choice], None)
        return table.append_column(
            "q_values", pa.array(list(q), type=pa.list_(pa.float32()))
        ).append_column("best_action", pa.array(best.tolist(), type=pa.string()))

    def greedy_actor(self, program: Any, space: DiscreteSpace, n_env_actions: int) -> Actor:
        # Action names that are integers name the environment's action; others go by position.
        env_action = [int(a) if a.isdigit() else i for i, a in enumerate(space.actions)]

        def act(state: Tensor, presence: Tensor) -> list[int]:
            q = program(state, presence)
            return [env_action[j] for j in q.argmax(dim=1).tolist()]

        return act

    def acting(self, space: DiscreteSpace) -> NamedActing:
        return NamedActing(self.name, space.actions)


class NamedActing(Acting):
    """Serving a model with one Q column per named action: a request may name a subset
    (default: all), the response names the chosen action, the log records names."""

    def __init__(self, kind: str, actions: Sequence[str]) -> None:
        self.kind, self.actions = kind, list(actions)
        self.column = {name: j for j, name in enumerate(self.actions)}

    def describe(self) -> dict[str, list[str]]:
        return {"actions": self.actions}

    def choose(self, offered: Offered) -> Choice:
        if offered is None:
            names = list(self.actions)
        elif all(isinstance(a, str) for a in offered):
            names = [str(a) for a in offered]
        else:
            raise RequestError(
                "possible_actions",
                f"a {self.kind} model takes action names (some of {self.actions}), not"
                " feature maps",
            )
        columns = []
        for i, name in enumerate(names):
            if name not in self.column:
                raise RequestError(
                    f"possible_actions[{i}]",
                    f"unknown action {name!r} (expected one of {self.actions})",
                )
            if name in names[:i]:
                raise RequestError(f"possible_actions[{i}]", f"action {name!r} is listed twice")
            columns.append(self.column[name])
        # Ties go to the lowest model column, as `predict`'s best_action.
        index = np.asarray(columns, np.int64)
        return Choice(answers=names, rank=index, logged=list(names), inputs=index)

    def q_values(
        self,
        program: Callable[..., Tensor],
        state: tuple[Tensor, Tensor],
        choices: Sequence[Choice],
    ) -> list[np.ndarray]:
        q = program(*state).numpy()
        return [q[i, c.inputs] for i, c in enumerate(choices)]


class DiscreteServingModule(nn.Module):
    """Raw feature values + presence in, Q for every action out."""

    def __init__(self, state_pre: Preprocessor, q_net: nn.Module):
        super().__init__()
        self.state_pre = state_pre
        self.q_net = q_net

    def forward(self, state_values: Tensor, state_presence: Tensor) -> Tensor:
        out: Tensor = self.q_net(self.state_pre(state_values, state_presence))
        return out


# ----------------------------------------------------------------------------- schema


def scored_candidates(table: pa.Table, actions: Sequence[str], source: str) -> np.ndarray | None:
    """[N, A] 0/1 mask of each row's `possible_actions` in a table to score (None without
    the column), once the column passes the training rules; a `DataError` naming `source`
    if not."""
    if "possible_actions" not in table.column_names or pa.types.is_null(
        table.schema.field("possible_actions").type
    ):  # (JSON Lines: a column of nulls throughout states no candidates)
        return None
    names = list(actions)
    candidates = next(f for f in dqn_schema(names).fields if f.name == "possible_actions")
    check = ShardValidation(TableSchema("scoring with a dqn model", (candidates,)), source=source)
    check.check(table.select(["possible_actions"]))
    check.finish(allow_empty=True)
    return actions_mask(table.column("possible_actions"), names, source)


def _no_action(actions: Sequence[str]) -> Rule:
    def rule(col: pa.ChunkedArray) -> Problems:
        idx = string_index(col, actions)
        return [((idx == NAME_NULL) | (idx == NAME_EMPTY), "no action (null or empty)")]

    return rule


def _unknown(actions: Sequence[str], what: str) -> Rule:
    return lambda col: [(name_rows(col, actions), what)]


def dqn_schema(actions: Sequence[str]) -> TableSchema:
    """A dqn table: actions named (one of `actions`), candidates as lists of names or as
    0/1 masks of one entry per action."""
    names = list(actions)
    unknown = f"unknown action name (expected one of {names})"
    in_list = (
        f"unknown action name, or a mask whose length is not {len(names)} "
        "or whose entries are not all 0 or 1"
    )
    possible = list_of(lambda t: is_str(t) or pa.types.is_integer(t) or pa.types.is_boolean(t))
    lists = "lists of action names, or 0/1 masks of len(actions)"
    # Horizon's data named actions "0", "1", ... and logged them as integer indices: an
    # integer column is read as those names when every action name is a decimal integer.
    decimal = all(n.isdigit() and str(int(n)) == n for n in names)
    named = (lambda t: is_str(t) or pa.types.is_integer(t)) if decimal else is_str
    ints = ", or integers: the actions are decimal names" if decimal else ""
    return transition_schema(
        "dqn",
        [
            field("action", named, f"action names (strings{ints})", _no_action(names),
                  _unknown(names, unknown)),
            field("next_action", or_null(named), f"action names (strings or null{ints})",
                  _unknown(names, f'unknown action name (expected one of {names}, or null/"")')),
            field("possible_actions", possible, lists, _unknown(names, in_list)),
            field("possible_next_actions", possible, lists, _unknown(names, in_list)),
        ],
    )  # fmt: skip
