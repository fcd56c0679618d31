"""`benchmarks.speedups --quick` runs end to end on a CPU: the CPU row (freed heap blocks
kept, each arm in a fresh process) beside its plain path, each arm having taken the choice
asked, a finite ratio, and the rows that cannot run here listed with why (tiny runs: this
checks the command, not the speed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import run_module

pytest.importorskip("gymnasium")  # the benchmark's dqn data comes from CartPole


@pytest.mark.bench_smoke
@pytest.mark.timeout(900)
def test_quick_cpu_run_prints_each_cpu_row_beside_its_plain_path(tmp_path: Path) -> None:
    out = tmp_path / "speedups.json"
    proc = run_module(
        "benchmarks.speedups",
        *("--quick", "--data-dir", str(tmp_path / "data"), "--json", str(out)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = json.loads(out.read_text())
    rows = measured["rows"]
    assert set(rows) == {
        "keep_freed_memory [parametric eager fp32]",
    }, (rows, measured["skipped"])
    for name, row in rows.items():
        assert row["took"]["speed"] == "on" and row["took"]["plain"].startswith("off ("), name
        assert len(row["rounds"]["speed"]) == len(row["rounds"]["plain"]) == 2, name
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, (name, row)
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(name))
        assert f"{row['ratio']:.3f} (" in line, line
    assert rows["keep_freed_memory [parametric eager fp32]"]["took"]["plain"] == (
        "off (training.step_plan.keep_freed_memory is off)"
    )
    # Every other speed-up is named with the reason it did not run on this CPU.
    skipped = measured["skipped"]
    assert skipped["output_sum [dqn compiled fp32]"].startswith("--quick: ")
    for name in ("pad_first_layer", "candidate_kernel", "compile_cache"):
        assert skipped[name].startswith("cpu: ") and len(skipped[name]) > len("cpu: "), name
        assert f"skipped: {name}: cpu: " in proc.stdout


def test_each_rows_arms_are_valid_configs_that_differ_in_its_switch_only(tmp_path: Path) -> None:
    """Every row's two arms are configs the loader accepts (a misspelt key would be a
    ConfigError), the same but for the row's own switch."""
    import argparse

    from benchmarks.bench_train import bench_config
    from benchmarks.speedups import ROWS, arm_training, label
    from reagent_lite.config import (
        DQNWorkflowConfig,
        ParametricDQNWorkflowConfig,
        config_from_dict,
    )

    args = argparse.Namespace(batch=64, steps=2)
    assert len({label(r) + str(r.devices) for r in ROWS}) == len(ROWS)
    for row in ROWS:
        cls = DQNWorkflowConfig if row.kind == "dqn" else ParametricDQNWorkflowConfig
        arms = []
        for arm in ("speed", "plain"):
            cfg = bench_config(row.kind, tmp_path, tmp_path / "out", args.batch)
            cfg["training"].update(arm_training(row, arm))
            arms.append(config_from_dict(cfg, cls).training)
        speed, plain = (a.model_dump() for a in arms)
        differ = {
            (group, key)
            for group in ("step_variants", "step_plan")
            for key in speed[group]
            if speed[group][key] != plain[group][key]
        }
        group = "step_variants" if row.plan_key in speed["step_variants"] else "step_plan"
        assert differ == {(group, row.plan_key)}, (label(row), differ)
        assert {k: v for k, v in speed.items() if k not in ("step_variants", "step_plan")} == {
            k: v for k, v in plain.items() if k not in ("step_variants", "step_plan")
        }, label(row)


def test_an_unknown_row_is_refused_naming_it() -> None:
    proc = run_module("benchmarks.speedups", "--rows", "output_sum,p2p_allreduce", timeout=120)
    assert proc.returncode == 2
    assert "--rows: unknown ['p2p_allreduce']" in proc.stderr
