"""reagent_lite.data: reading, sharding, validating and tensorizing logged transitions."""

from reagent_lite.data.batches import DiscreteTransitions, ParametricTransitions
from reagent_lite.data.readers import (
    ShardPiece,
    ShardSpec,
    list_data_files,
    read_shard,
    read_table,
    shard_plan,
)
from reagent_lite.data.sampler import EpochSampler, steps_for
from reagent_lite.data.tensorize import (
    collect_feature_ids,
    sparse_to_dense,
    tensorize_discrete,
    tensorize_parametric,
)
from reagent_lite.data.validate import ValidationReport, validate

__all__ = [
    "DiscreteTransitions",
    "EpochSampler",
    "ParametricTransitions",
    "ShardPiece",
    "ShardSpec",
    "ValidationReport",
    "collect_feature_ids",
    "list_data_files",
    "read_shard",
    "read_table",
    "shard_plan",
    "sparse_to_dense",
    "steps_for",
    "tensorize_discrete",
    "tensorize_parametric",
    "validate",
]
