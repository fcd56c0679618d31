"""A rank's training shard, loaded: read, validated, tensorized, normalized (on the CPU).

Two ways in, one result (`LoadedShard`), both through the ingest engine (`data/ingest.py`):
* resident (`kind.load_shard`): row group by row group into preallocated arrays;
* `stream_from_disk`: only a normalization sample is read here, and a `DiskShardStream`
  reads the shard window by window while training.

Normalization is loaded from the configured files or fitted by rank 0 from every rank's
sample and broadcast, so all ranks hold bit-identical parameters whatever their shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reagent_lite.config import BaseWorkflowConfig
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.rows import Rows
from reagent_lite.data.shard_builder import IngestedShard
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError
from reagent_lite.kinds import FeatureSpace, Kind
from reagent_lite.normalization.checks import warn_constant_features
from reagent_lite.normalization.identify import fit_normalization
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.normalization.params import NormalizationParameters, load_normalization
from reagent_lite.training.verify import emulated_world_size


@dataclass
class LoadedShard:
    space: FeatureSpace
    norm: dict[str, dict[str, NormalizationParameters]]
    pre: dict[str, Preprocessor]
    # The normalized training tensors (under `stream_from_disk`: only the sample).
    train_data: Rows
    timings: dict[str, float]  # seconds per stage
    disk: DiskShardStream | None = None
    # Rows of each emulated rank's shard (REAGENT_LITE_EMULATE_WORLD_SIZE), else None.
    emulated_shards: list[int] | None = None


def load_training_shard(kind: Kind[Any], cfg: BaseWorkflowConfig, ctx: DistContext) -> LoadedShard:
    """This rank's training shard, normalized (see the module notes)."""
    clock = time.perf_counter
    t0 = clock()
    timings: dict[str, float]
    units = None
    emulated: list[int] | None = None
    if cfg.stream_from_disk:
        # Only a sample is read here; training reads the shard window by window.
        space, raw, units = kind.open_disk_sample(ctx, cfg, cfg.training_data_path)
        timings = {"sample": clock() - t0}
    else:
        # Emulating W ranks: their W shards end to end, in rank order.
        world = emulated_world_size(ctx.world_size)
        parts = [(r, world) for r in range(world)] if world else [(ctx.rank, ctx.world_size)]
        space, raw = kind.load_shard(ctx, cfg, cfg.training_data_path, parts)
        timings = dict(raw.timings)
        if world is not None:
            emulated = raw.rows_per_part
    t1 = clock()
    norm = _normalization(kind, cfg, ctx, space, raw)
    pre = {name: Preprocessor(space.ids(name), params) for name, params in norm.items()}
    t2 = clock()
    train_data = kind.training_tensors(raw, pre)
    del raw
    disk = kind.disk_stream(ctx, cfg, units, space, pre) if units is not None else None
    t3 = clock()
    timings = {**timings, "fit": t2 - t1, "normalize": t3 - t2, "total": t3 - t0}
    return LoadedShard(space, norm, pre, train_data, timings, disk, emulated)


def _normalization(
    kind: Kind[Any],
    cfg: BaseWorkflowConfig,
    ctx: DistContext,
    space: FeatureSpace,
    raw: IngestedShard,
) -> dict[str, dict[str, NormalizationParameters]]:
    """Loads the configured normalization, or fits it from a sample of every shard."""
    given = kind.norm_files(cfg)
    norm: dict[str, dict[str, NormalizationParameters]] = {}
    per_rank = max(1, cfg.normalization_sample_size // ctx.world_size)
    samples = kind.norm_samples(raw, per_rank, cfg.seed + ctx.rank)
    for name, path in given.items():
        sample = samples[name]
        if path:
            norm[name] = load_normalization(Path(path))
            missing = [f for f in space.ids(name) if f not in norm[name]]
            if missing:
                raise ConfigError(
                    f"{name}_norm_data_path: {path} has no parameters for feature ids "
                    f"{missing[:10]} found in the training data"
                )
        else:
            # Every rank contributes its sample; rank 0 fits and broadcasts.
            gathered = ctx.all_gather_object(sample)
            fitted = None
            if ctx.is_rank_zero:
                sample = np.concatenate(gathered, axis=0)
                fitted = fit_normalization(
                    sample,
                    space.ids(name),
                    action=(name == "action"),
                    feature_overrides=cfg.normalization_overrides.for_group(name),
                )
            norm[name] = ctx.broadcast_object(fitted)
        if ctx.is_rank_zero:  # rank 0's sample (all ranks' when fitted) shows the rest
            warn_constant_features(name, Preprocessor(space.ids(name), norm[name]), sample)
    return norm
