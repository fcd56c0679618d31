"""The streamed forms of a kind's training data, shared by the dqn and parametric kinds.

`StreamedShard`: a shard from the streaming ingest (`data/ingest.py`), NaN-coded feature
matrices instead of values + presence. `DiskStreaming`: what `stream_from_disk` asks of a
kind (`open_disk_sample`, `disk_stream`), built on the two things a kind knows — how to
find its feature space from a keys scan of the shard, and how to load a window of units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from reagent_lite.data.disk_stream import DiskShardStream, stream_units
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.shard_builder import IngestedShard
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import DataError
from reagent_lite.normalization.module import Preprocessor, one_intraop_thread
from reagent_lite.training.steps import EVAL_ONLY_FIELDS
from reagent_lite.training.tensordict import TensorDict

if TYPE_CHECKING:
    from reagent_lite.training.kinds import FeatureSpace


@dataclass
class StreamedShard:
    """A shard from the streaming ingest (`data/ingest.py`): feature matrices in agreed-id
    order with NaN = absent (no presence matrices), other fields as tensors."""

    features: dict[str, Tensor]  # e.g. "state", "next_state": float32 [N, F]
    other: dict[str, Tensor]
    rows_per_part: list[int]

    def __len__(self) -> int:
        return int(next(iter(self.features.values())).shape[0])

    @classmethod
    def of(cls, shard: IngestedShard) -> StreamedShard:
        """The arrays of an ingested shard, as tensors sharing their memory."""
        return cls(
            {k: torch.from_numpy(v) for k, v in shard.features.items()},
            {k: torch.from_numpy(v) for k, v in shard.fields.items()},
            shard.rows_per_part or [len(shard)],
        )


def sample_nan_rows(values: Tensor, n: int, seed: int) -> np.ndarray:
    """`_sample_rows` for NaN-coded values: the same rows, without copying the shard."""
    with one_intraop_thread():
        return _sample_nan_rows_1(values, n, seed)


def _sample_nan_rows_1(values: Tensor, n: int, seed: int) -> np.ndarray:
    any_present = torch.empty(values.shape[0], dtype=torch.bool)
    step = 1 << 16  # bounds the [rows, F] temporaries
    for s in range(0, values.shape[0], step):
        any_present[s : s + step] = ~torch.isnan(values[s : s + step]).all(dim=1)
    keep = torch.nonzero(any_present).squeeze(1)
    if keep.shape[0] > n:
        gen = torch.Generator().manual_seed(seed)
        keep = keep[torch.randperm(keep.shape[0], generator=gen)[:n]]
    return values[keep].numpy().astype(np.float64)


class DiskStreaming:
    """`stream_from_disk` for a kind that says how to find its feature space from a keys
    scan of the shard's units (`_scan_space`) and how to load a window of units
    (`_load_window`); the rest — the seeded sample, the stream — is common."""

    def _scan_space(self, ctx: DistContext, cfg: Any, units: list[ShardPiece]) -> FeatureSpace:
        raise NotImplementedError

    def _load_window(
        self, cfg: Any, space: FeatureSpace, units: Sequence[ShardPiece]
    ) -> StreamedShard:
        raise NotImplementedError

    def training_tensors(self, raw: Any, pre: dict[str, Preprocessor]) -> TensorDict:
        raise NotImplementedError

    def open_disk_sample(
        self, ctx: DistContext, cfg: Any, path: str
    ) -> tuple[FeatureSpace, StreamedShard, list[Any]]:
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
        space = self._scan_space(ctx, cfg, units)
        want = min(cfg.stream_window_rows, max(1, cfg.normalization_sample_size // ctx.world_size))
        order = np.random.default_rng([cfg.seed, ctx.rank, 1]).permutation(len(units))
        picked: list[Any] = []
        rows = 0
        for i in order:
            if rows >= want:
                break
            picked.append(units[int(i)])
            rows += units[int(i)].num_rows or 0
        return space, self._load_window(cfg, space, picked), units

    def disk_stream(
        self,
        ctx: DistContext,
        cfg: Any,
        units: list[Any],
        space: FeatureSpace,
        pre: dict[str, Preprocessor],
    ) -> DiskShardStream:
        """The stream of training windows: each loaded, normalized in place and cut to the
        columns training reads, in a background thread (`DiskShardStream`)."""

        def load(window: Sequence[ShardPiece]) -> dict[str, Tensor]:
            data = self.training_tensors(self._load_window(cfg, space, window), pre)
            return {k: v for k, v in data.items() if k not in EVAL_ONLY_FIELDS}

        return DiskShardStream(
            units, load, window_rows=cfg.stream_window_rows, seed=cfg.seed, rank=ctx.rank
        )


def ingest_opts(cfg: Any) -> dict[str, Any]:
    """The options of the streaming ingest a config sets (both kinds, every loader)."""
    return {
        "use_seq_num_diff_as_time_diff": cfg.rl.use_seq_num_diff_as_time_diff,
        "drop_bad_rows": cfg.drop_bad_rows,
    }
