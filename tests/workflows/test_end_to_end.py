"""Both workflows end to end, as a user runs them: real subprocesses, real files.

Each run generates its own small data set (the config's `sample_data` block), trains for a
couple of epochs and exports; the tests then load `model.pt2` and score with `predict`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from reagent_lite.training.metrics import read_metrics
from tests.conftest import REPO_ROOT, run_module

CI_CONFIGS = REPO_ROOT / "sample_configs" / "ci"


def make_config(tmp_path: Path, kind: str, **overrides: Any) -> Path:
    """A tiny config for `kind` with every path inside tmp_path."""
    data = tmp_path / "data"
    cfg: dict[str, Any] = {
        "training_data_path": str(data / "train.parquet"),
        "eval_data_path": str(data / "eval.parquet"),
        "model_output_path": str(tmp_path / "out"),
        "use_gpu": False,
        "epochs": 2,
        "seed": 3,
        "training": {
            "layers": [-1, 32, 32, -1],
            "activations": ["relu", "relu", "linear"],
            "minibatch_size": 128,
            "learning_rate": 0.001,
        },
        "evaluation": {"calc_cpe_in_training": True, "bootstrap_samples": 20},
        "log_every_steps": 5,
    }
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
        cfg["sample_data"] = {
            "kind": "gym",
            "env": "CartPole-v1",
            "episodes": 60,
            "policy": "random",
            "seed": 1,
        }
    else:
        cfg["sample_data"] = {"kind": "synthetic_parametric", "episodes": 1500, "seed": 1}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    path = tmp_path / f"{kind}.json"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=1))
    return path


def workflow_module(kind: str) -> str:
    return f"workflows.{kind}_workflow"


def check_run_outputs(out: Path, kind: str) -> None:
    for name in (
        "model.pt2",
        "model_meta.json",
        "normalization.json",
        "config.json",
        "metrics.jsonl",
    ):
        assert (out / name).is_file(), f"missing {name}"
    assert not list(out.glob(".*.tmp*")), "temp files left behind"
    meta = json.loads((out / "model_meta.json").read_text())
    assert meta["workflow"] == kind
    epochs = [r for r in read_metrics(out / "metrics.jsonl") if "transitions_per_s" in r]
    assert [r["epoch"] for r in epochs] == [0, 1]
    for record in epochs:
        assert record["transitions_per_s"] > 0
        assert record["loss"] >= 0
        assert "cpe" in record and "doubly_robust" in record["cpe"]
    program = torch.export.load(str(out / "model.pt2")).module()
    n_state = len(meta["state_feature_ids"])
    for batch in (1, 7):
        state = torch.randn(batch, n_state)
        presence = torch.ones(batch, n_state)
        if kind == "dqn":
            q = program(state, presence)
            assert q.shape == (batch, len(meta["actions"]))
        else:
            k, g = 5, len(meta["action_feature_ids"])
            mask = torch.ones(batch, k)
            mask[:, -1] = 0
            q = program(state, presence, torch.randn(batch, k, g), torch.ones(batch, k, g), mask)
            assert q.shape == (batch, k)
            assert torch.isinf(q[:, -1]).all() and torch.isfinite(q[:, :-1]).all()
        assert torch.isfinite(q).any()


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_workflow_trains_exports_and_predicts(tmp_path: Path, kind: str) -> None:
    config = make_config(tmp_path, kind)
    result = run_module(workflow_module(kind), "--config", str(config), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    check_run_outputs(out, kind)
    assert f"report: {out / 'report.png'}" in result.stdout
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    scored_path = tmp_path / "scores.parquet"
    result = run_module(
        "reagent_lite.predict",
        "--model",
        str(out),
        "--data",
        str(tmp_path / "data" / "eval.parquet"),
        "--output",
        str(scored_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scored = pq.read_table(scored_path)
    eval_rows = pq.read_table(tmp_path / "data" / "eval.parquet").num_rows
    assert scored.num_rows == eval_rows
    column = "best_action" if kind == "dqn" else "best_candidate"
    assert scored.column(column).null_count == 0
    # A table of no rows scores to no rows; a bad batch size and data with none of the
    # model's features are errors that say so.
    eval_table = pq.read_table(tmp_path / "data" / "eval.parquet")
    pq.write_table(eval_table.slice(0, 0), tmp_path / "none.parquet")
    result = run_module("reagent_lite.predict", "--model", str(out), "--data",
                        str(tmp_path / "none.parquet"), "--output", str(scored_path))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert pq.read_table(scored_path).num_rows == 0
    result = run_module("reagent_lite.predict", "--model", str(out), "--data",
                        str(tmp_path / "data" / "eval.parquet"), "--output", str(scored_path),
                        "--batch-size", "0")  # fmt: skip
    assert result.returncode == 2 and "--batch-size" in result.stderr, result.stderr[-2000:]
    state_col = "state_features"

    def predict_with_states(states: list[Any], name: str) -> subprocess.CompletedProcess[str]:
        """predict on the eval table with its state column replaced by `states`."""
        changed = eval_table.set_column(
            eval_table.schema.get_field_index(state_col), state_col,
            pa.array(states, type=eval_table.schema.field(state_col).type),
        )  # fmt: skip
        pq.write_table(changed, tmp_path / name)
        return run_module("reagent_lite.predict", "--model", str(out), "--data",
                          str(tmp_path / name), "--output", str(scored_path))  # fmt: skip

    result = predict_with_states([[("9999", 1.0)]] * eval_table.num_rows, "foreign.parquet")
    assert result.returncode == 3, result.stderr[-2000:]
    assert "no row holds any of the model's state features" in result.stderr
    assert "Traceback" not in result.stderr
    # A NaN feature value is an error naming the file, column and row, not a NaN score.
    values = eval_table.column(state_col).to_pylist()
    values[3] = [(k, float("nan")) for k, _ in values[3]]
    result = predict_with_states(values, "nan.parquet")
    assert result.returncode == 3, result.stderr[-2000:]
    assert "nan.parquet: column 'state_features': 1 bad row" in result.stderr
    assert "row 3" in result.stderr and "Traceback" not in result.stderr


def test_unwritable_output_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the output directory should be")
    config = make_config(tmp_path, "dqn", model_output_path=str(blocker / "out"))
    result = run_module(workflow_module("dqn"), "--config", str(config), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model_output_path" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data" / "train.parquet").exists(), "work started before the check"


@pytest.mark.parametrize("bcq", [False, True], ids=["dqn", "bcq"])
def test_resume_continues_to_identical_parameters(tmp_path: Path, bcq: bool) -> None:
    # BCQ: the imitation network is part of the checkpointed state and of model.pt2.
    extra: dict[str, Any] = {"rainbow": {"bcq_drop_threshold": 0.3}} if bcq else {}
    sel = {"model_selection": "last"}
    full = make_config(tmp_path / "full", "dqn", epochs=3, evaluation=sel, **extra)
    assert run_module(workflow_module("dqn"), "--config", str(full), timeout=240).returncode == 0
    # The same run cut after epoch 2, then resumed to epoch 3 from its checkpoint.
    part = make_config(tmp_path / "part", "dqn", epochs=2, evaluation=sel, **extra)
    assert run_module(workflow_module("dqn"), "--config", str(part), timeout=240).returncode == 0
    resumed = make_config(tmp_path / "part", "dqn", epochs=3, evaluation=sel, **extra)
    result = run_module(workflow_module("dqn"), "--config", str(resumed), "--resume", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    want = torch.load(tmp_path / "full" / "out" / "model_state.pt")["q_net"]
    got = torch.load(tmp_path / "part" / "out" / "model_state.pt")["q_net"]
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert any(name.startswith("imitator.") for name in want) == bcq
    if bcq:  # the served policy never takes an action the imitator drops
        from reagent_lite.predict import Predictor

        eval_table = pq.read_table(tmp_path / "part" / "data" / "eval.parquet")
        scored = Predictor(tmp_path / "part" / "out").score(eval_table)
        q = scored.column("q_values").to_pylist()
        best = [int(a) for a in scored.column("best_action").to_pylist()]
        assert all(row[b] > torch.finfo(torch.float32).min for row, b in zip(q, best, strict=True))


def test_two_nodes_train_and_only_node_zero_writes(tmp_path: Path) -> None:
    shared = tmp_path / "nfs"
    shared.mkdir()
    config = make_config(
        shared,
        "dqn",
        num_nodes=2,
        init_method=(shared / "rendezvous").as_uri(),
        rendezvous_timeout_s=60,
        collective_timeout_s=60,
    )
    # Node 0 generates the data before it joins; node 1 waits in the rendezvous.
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workflows.dqn_workflow",
                "--config",
                str(config),
                f"--node_index={i}",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240))
    finally:
        for proc in procs:
            proc.kill()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    out = shared / "out"
    check_run_outputs(out, "dqn")
    records = [r for r in read_metrics(out / "metrics.jsonl") if "transitions_per_s" in r]
    assert all(r["world_size"] == 2 for r in records)
    assert "model:" in outputs[0][0] and "model:" not in outputs[1][0]
    leftovers = list(shared.glob("rendezvous.rdzv/**/*store*"))
    assert not leftovers, f"rendezvous store files left behind: {leftovers}"
