"""`--resume` continues only what the checkpoint was trained on: input files that changed
since are refused (exit 2, naming the file), and a fresh run that died before training
does not hand its `--resume` an earlier, finished run."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training import loop
from reagent_lite.training.inputs import changes, fingerprint
from reagent_lite.training.ownership import current_run_id
from tests.conftest import run_module
from tests.training.runs import run_workflow, tiny_dqn_config
from tests.workflows.test_end_to_end import make_config


def test_resume_refuses_a_training_table_rewritten_in_place(tmp_path: Path) -> None:
    config = make_config(tmp_path, "dqn", epochs=1, evaluation={"calc_cpe_in_training": False})
    first = run_module("workflows.dqn_workflow", "--config", str(config), timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "out"
    model = hashlib.sha256((out / "model.pt2").read_bytes()).hexdigest()
    newest = ckpt.latest_checkpoint(out)

    # The same table, its rewards scaled: a valid table, other data.
    train = tmp_path / "data" / "train.parquet"
    original, original_ns = train.read_bytes(), train.stat().st_mtime_ns
    table = pq.read_table(train)
    column = table.schema.get_field_index("reward")
    scaled = pc.multiply(table.column(column), 2.0)
    pq.write_table(table.set_column(column, "reward", scaled), train)
    cfg = json.loads(config.read_text())
    cfg["epochs"] = 2
    config.write_text(json.dumps(cfg))

    second = run_module("workflows.dqn_workflow", "--config", str(config), "--resume", timeout=240)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert f"training_data_path: {train} changed" in second.stderr
    assert "start a fresh run" in second.stderr
    # Nothing was trained or written on the new data.
    assert hashlib.sha256((out / "model.pt2").read_bytes()).hexdigest() == model
    assert ckpt.latest_checkpoint(out) == newest

    # The original table back, the eval table touched: the eval table counts too.
    train.write_bytes(original)
    os.utime(train, ns=(original_ns, original_ns))
    evaluation = tmp_path / "data" / "eval.parquet"
    eval_ns = evaluation.stat().st_mtime_ns
    os.utime(evaluation, ns=(eval_ns + 10**9, eval_ns + 10**9))
    third = run_module("workflows.dqn_workflow", "--config", str(config), "--resume", timeout=240)
    assert third.returncode == 2, third.stderr[-3000:]
    assert f"eval_data_path: {evaluation} changed (mtime_ns" in third.stderr
    assert f"training_data_path: {train}" not in third.stderr

    # Both as they were: the run resumes.
    os.utime(evaluation, ns=(eval_ns, eval_ns))
    fourth = run_module("workflows.dqn_workflow", "--config", str(config), "--resume", timeout=240)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "resumed from" in fourth.stderr


def test_a_fresh_run_that_dies_loading_data_is_what_resume_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = run_workflow(tiny_dqn_config(tmp_path, epochs=1))
    out = tmp_path / "out"
    assert ckpt.latest_checkpoint(out) is not None

    # The next fresh run is killed while it reads its data.
    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(loop, "load_training_shard", killed)
        with pytest.raises(KeyboardInterrupt):
            run_workflow(tiny_dqn_config(tmp_path, epochs=1))
    interrupted = current_run_id(out)
    assert interrupted is not None and interrupted != finished.run_id

    # --resume continues that run (nothing to resume: from scratch), not the finished one.
    resumed = run_workflow(tiny_dqn_config(tmp_path, epochs=2), resume=True)
    assert resumed.run_id == interrupted
    assert resumed.start_epoch == 0 and [r["epoch"] for r in resumed.history] == [0, 1]


def test_a_table_rewritten_to_the_same_size_and_mtime_is_still_told_apart(tmp_path: Path) -> None:
    # Large enough that only the Parquet footer (row-group statistics) is digested.
    path = tmp_path / "t.parquet"

    def write(seed: int) -> None:
        values = np.random.default_rng(seed).normal(size=50_000)
        pq.write_table(pa.table({"reward": values}), path, compression="none")

    write(0)
    cfg = tiny_dqn_config(tmp_path).model_copy(update={"training_data_path": str(path)})
    before, stat = fingerprint(cfg), path.stat()
    write(1)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    assert changes(before, fingerprint(cfg)) == [
        f"training_data_path: {path} changed (content digest differs)"
    ]
    assert changes(before, before) == []
