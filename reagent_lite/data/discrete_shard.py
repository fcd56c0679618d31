"""The dqn shard: state matrices, action indices and action masks (`DiscreteShardBuilder`
collects one batch by batch; `data/shard_builder.py` tells the method)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from reagent_lite.data.arrow import column_of
from reagent_lite.data.scatter import action_index, actions_mask, worker_pool
from reagent_lite.data.schema import NEXT_STATE_COLUMNS, STATE_COLUMNS
from reagent_lite.data.shard_builder import (
    FeatureColumns,
    IngestedShard,
    ShardBuilder,
    reorder_columns,
)
from reagent_lite.data.validate import ValidationReport
from reagent_lite.errors import DataError

# The order of the training tensors after "state" and "next_state".
DISCRETE_FIELDS = (
    "action", "next_action", "reward", "possible_actions_mask", "possible_next_actions_mask",
    "terminal", "time_diff", "propensity", "mdp_id", "sequence_number",
)  # fmt: skip


@dataclass
class DiscreteShard(IngestedShard):
    """A dqn shard as arrays: `features` "state" / "next_state" float32 [N, C] in
    `columns.ids` order with NaN = absent; `fields`: `action` / `next_action` int64 [N]
    (index into the actions; -1: none), `possible_actions_mask` /
    `possible_next_actions_mask` float32 [N, A], `reward`, `terminal` (1 = terminal),
    `time_diff`, `propensity` float32 [N], `mdp_id` (dense codes), `sequence_number`
    int64 [N]."""

    @property
    def state(self) -> np.ndarray:
        return self.features["state"]

    @property
    def next_state(self) -> np.ndarray:
        return self.features["next_state"]

    def reorder(self, feature_ids: Sequence[str]) -> None:
        """Makes `state` and `next_state` columns follow `feature_ids` (`reorder_columns`)."""
        ids = list(feature_ids)
        self.features = {k: reorder_columns(v, self.columns, ids) for k, v in self.features.items()}
        self.columns = FeatureColumns(ids)


class DiscreteShardBuilder(ShardBuilder[DiscreteShard]):
    """Collects a dqn shard batch by batch (see `data/shard_builder.py`)."""

    def __init__(
        self,
        actions: Sequence[str],
        *,
        capacity: int | None,
        use_seq_num_diff_as_time_diff: bool = False,
        source: str = "table",
        feature_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(
            capacity=capacity,
            use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
            source=source,
            feature_ids=feature_ids,
        )
        self.actions = list(actions)
        A = len(self.actions)
        for name in ("action", "next_action"):
            self.alloc(name, (), np.int64)
        for name in ("possible_actions_mask", "possible_next_actions_mask"):
            self.alloc(name, (A,), np.float32)

    def add(self, table: pa.Table) -> None:
        b = table.num_rows
        if b == 0:
            return
        src, actions = self.source, self.actions
        s_col = column_of(table, STATE_COLUMNS, src)
        ns_col = column_of(table, NEXT_STATE_COLUMNS, src)
        self.discover(s_col, self.columns, self.state_ids)
        self.discover(ns_col, self.columns)
        lo, hi = self.n, self.n + b
        self.ensure(hi)
        f = self.arrays
        s_out, ns_out = f["state"][lo:hi], f["next_state"][lo:hi]
        fut = None
        if b >= 16_384:  # state and next_state scatter in parallel (numpy releases the GIL)
            fut = worker_pool().submit(self.scatter, ns_col, ns_out, self.columns)
        else:
            self.scatter(ns_col, ns_out, self.columns)
        self.scatter(s_col, s_out, self.columns)
        action = action_index(column_of(table, ["action"], src), actions)
        if (action < 0).any():
            bad = int((action < 0).sum())
            raise DataError(f"{src}: column 'action': {bad} rows name no known action {actions}")
        f["action"][lo:hi] = action
        f["next_action"][lo:hi] = action_index(column_of(table, ["next_action"], src), actions)
        pna = actions_mask(column_of(table, ["possible_next_actions"], src), actions, src)
        f["possible_next_actions_mask"][lo:hi] = pna
        f["possible_actions_mask"][lo:hi] = actions_mask(
            column_of(table, ["possible_actions"], src), actions, src
        )
        self.common(table, lo, hi, pna.sum(axis=1) == 0)
        if fut is not None:
            fut.result()
        self.n = hi

    def finish(self, report: ValidationReport) -> DiscreteShard:
        return DiscreteShard(
            report,
            columns=self.columns,
            state_ids=self.state_ids,
            features=self.rows(("state", "next_state")),
            fields=self.rows(DISCRETE_FIELDS),
            episodes=list(self.episode_codes),
        )
