"""The parametric_dqn shard (`ParametricShardBuilder` collects one batch by batch;
`data/shard_builder.py` tells the method).

On top of the state matrices a parametric shard holds the logged and next actions as
NaN-coded matrices [N, G] and the candidate sets as padded NaN-coded tensors [N, K, G]
(a padded slot is all NaN) with their masks [N, K].

Two things are only known at the end. The action feature ids the workflow agrees on are
those of the `action` column, but a candidate of an early row group may carry an id that
only a later logged action shows, so every id of the four action columns gets a column and
`ParametricShard.conform` keeps the agreed ones. K, unless fixed by `max_candidates`, is
the longest candidate list so far (the tensors grow with it) and `conform` pads to the
agreed K. `action_index` — the logged action's slot among the candidates — is computed by
`conform` too, once the columns are final.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from reagent_lite.data.arrow import column_of, list_lengths
from reagent_lite.data.scatter import match_index, scatter_candidates
from reagent_lite.data.schema import NEXT_STATE_COLUMNS, STATE_COLUMNS
from reagent_lite.data.shard_builder import (
    FeatureColumns,
    IngestedShard,
    ShardBuilder,
    reorder_columns,
)
from reagent_lite.data.validate import ValidationReport

ACTION_COLUMNS = ("action", "next_action")
CANDIDATE_COLUMNS = ("possible_actions", "possible_next_actions")
# The order of the training tensors.
PARAMETRIC_FIELDS = (
    "state", "next_state", "action", "next_action", "possible_actions",
    "possible_actions_mask", "possible_next_actions", "possible_next_actions_mask",
    "action_index", "reward", "terminal", "time_diff", "propensity", "mdp_id",
    "sequence_number",
)  # fmt: skip
FEATURES = ("state", "next_state", *ACTION_COLUMNS, *CANDIDATE_COLUMNS)


@dataclass
class ParametricShard(IngestedShard):
    """A parametric shard as arrays: `features` (state, next_state [N, F] in `columns.ids`
    order; action, next_action [N, G] and the candidate tensors [N, K, G] in
    `action_columns.ids` order; NaN = absent) and `fields` (masks [N, K], `action_index`
    int64 [N] once conformed, and the per-row fields of every transition table).
    `action_ids`: the ids seen in `action` (those the workflow agrees on). Call `conform`
    before use."""

    action_columns: FeatureColumns
    action_ids: set[str]
    max_candidates: int

    def merge_seen(self, other: IngestedShard) -> None:
        super().merge_seen(other)
        if isinstance(other, ParametricShard):
            self.action_ids |= other.action_ids

    def conform(
        self, state_ids: Sequence[str], action_ids: Sequence[str], max_candidates: int
    ) -> None:
        """Columns in the order of the agreed ids (`reorder_columns`), candidate tensors
        padded to `max_candidates` slots, and `fields["action_index"]`."""
        f, states, actions = self.features, list(state_ids), list(action_ids)
        for name in FEATURES:
            if name in ("state", "next_state"):
                f[name] = reorder_columns(f[name], self.columns, states)
            else:
                f[name] = reorder_columns(f[name], self.action_columns, actions)
        self.columns, self.action_columns = FeatureColumns(states), FeatureColumns(actions)
        pad = max_candidates - self.max_candidates
        if pad < 0:
            raise ValueError(f"{self.max_candidates} candidate slots; asked for {max_candidates}")
        if pad:
            for name in CANDIDATE_COLUMNS:
                n, _, g = f[name].shape
                f[name] = np.concatenate([f[name], np.full((n, pad, g), np.nan, np.float32)], 1)
                mask = self.fields[f"{name}_mask"]
                self.fields[f"{name}_mask"] = np.pad(mask, ((0, 0), (0, pad)))
            self.max_candidates = max_candidates
        self.fields["action_index"] = match_index(
            f["action"], f["possible_actions"], self.fields["possible_actions_mask"]
        )


class ParametricShardBuilder(ShardBuilder[ParametricShard]):
    """Collects a parametric shard batch by batch (see the module docstring); K is fixed
    when `max_candidates` is given (a longer list is a `DataError`), else the longest list
    so far. The agreed ids, when known (`state_feature_ids`, `action_feature_ids`), get the
    first columns, in that order."""

    def __init__(
        self,
        *,
        capacity: int | None,
        max_candidates: int | None = None,
        use_seq_num_diff_as_time_diff: bool = False,
        source: str = "table",
        state_feature_ids: Sequence[str] = (),
        action_feature_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(
            capacity=capacity,
            use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
            source=source,
            feature_ids=state_feature_ids,
        )
        self.action_columns = FeatureColumns(action_feature_ids)
        self.action_ids: set[str] = set()
        self.fixed_k = max_candidates
        self.k = max_candidates or 1
        for name in ACTION_COLUMNS:
            self.alloc(name, (0,), np.float32)
        for name in CANDIDATE_COLUMNS:
            self.alloc(name, (self.k, 0), np.float32)
            self.alloc(f"{name}_mask", (self.k,), np.float32, fill=0.0)

    def tails(self) -> dict[str, tuple[int, ...]]:
        g, k = len(self.action_columns.ids), self.k
        tails = super().tails()
        for name in ACTION_COLUMNS:
            tails[name] = (g,)
        for name in CANDIDATE_COLUMNS:
            tails[name], tails[f"{name}_mask"] = (k, g), (k,)
        return tails

    def add(self, table: pa.Table) -> None:
        b = table.num_rows
        if b == 0:
            return
        src = self.source
        s_col = column_of(table, STATE_COLUMNS, src)
        ns_col = column_of(table, NEXT_STATE_COLUMNS, src)
        acts = {c: column_of(table, [c], src) for c in (*ACTION_COLUMNS, *CANDIDATE_COLUMNS)}
        self.discover(s_col, self.columns, self.state_ids)
        self.discover(ns_col, self.columns)
        self.discover(acts["action"], self.action_columns, self.action_ids)
        for name in ("next_action", *CANDIDATE_COLUMNS):
            self.discover(acts[name], self.action_columns)
        lengths = {c: list_lengths(acts[c]) for c in CANDIDATE_COLUMNS}
        if self.fixed_k is None:
            self.k = max(self.k, *(int(v.max()) for v in lengths.values()))
        lo, hi = self.n, self.n + b
        self.ensure(hi)
        a = self.arrays
        for name, col, columns in (
            ("state", s_col, self.columns),
            ("next_state", ns_col, self.columns),
            *((c, acts[c], self.action_columns) for c in ACTION_COLUMNS),
        ):
            self.scatter(col, a[name][lo:hi], columns)
        for name in CANDIDATE_COLUMNS:
            out, mask = a[name][lo:hi], a[f"{name}_mask"][lo:hi]
            out.fill(np.nan)
            mask.fill(0.0)
            scatter_candidates(acts[name], self.action_columns.ids, out, mask, src)
        self.common(table, lo, hi, lengths["possible_next_actions"] == 0)
        self.n = hi

    def finish(self, report: ValidationReport) -> ParametricShard:
        fields = [f for f in PARAMETRIC_FIELDS if f not in FEATURES and f != "action_index"]
        return ParametricShard(
            report,
            columns=self.columns,
            state_ids=self.state_ids,
            action_columns=self.action_columns,
            action_ids=self.action_ids,
            max_candidates=self.k,
            features=self.rows(FEATURES),
            fields=self.rows(fields),
            episodes=list(self.episode_codes),
        )
