"""`benchmarks.multi_gpu` needs GPUs; here, on a CPU, the configs its weak-scaling runs
write load as the workflow they start would load them, for both kinds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from benchmarks.multi_gpu import parametric_common, run_common, scaling_fields
from reagent_lite.config import config_from_dict
from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig


@pytest.mark.parametrize("kind", ["dqn", "parametric"])
def test_weak_scaling_configs_load_for_either_kind(tmp_path: Path, kind: str) -> None:
    args = argparse.Namespace(
        steps=500, precision="bf16", compile=True, stop_check_every=16, kind=kind
    )
    common = run_common(tmp_path / "data", epochs=3)
    cls: Any = DQNWorkflowConfig
    if kind == "parametric":
        common = parametric_common(common, tmp_path / "pdata")
        cls = ParametricDQNWorkflowConfig
    fields = scaling_fields(common, args, batch=1024, graphs=True)
    fields.update(init_method=(tmp_path / "rdzv").as_uri(), model_output_path=str(tmp_path / "o"))
    cfg = config_from_dict(fields, cls)
    t = cfg.training
    assert (t.minibatch_size, t.steps_per_epoch, t.precision, t.compile) == (
        1024,
        500,
        "bf16",
        True,
    )
    assert cfg.stop_check_every_steps == 16 and cfg.use_all_avail_gpus and cfg.cuda_graphs
    assert list(t.layers) == [-1, 256, 256, -1]
    want = tmp_path / ("pdata" if kind == "parametric" else "data") / "train.parquet"
    assert cfg.training_data_path == str(want)
    if kind == "parametric":  # bench_train's data, made by the benchmark: no sample_data
        assert cfg.sample_data is None and cfg.eval_data_path is None
