"""bench_stream's table shapes and its pair mode (issue 41): real Parquet files, the pair in
a real child process."""

from __future__ import annotations

import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.bench_stream import SPARSE_IDS, SPARSE_PRESENT, make_table, run_child


def test_sparse_table_has_wide_sparse_state_maps(tmp_path: Path) -> None:
    path = make_table(tmp_path / "s.parquet", 3000, row_group=1000, shape="sparse")
    table = pq.read_table(path)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    for column in ("state_features", "next_state_features"):
        keys = [[k for k, _ in row] for row in table.column(column).to_pylist()]
        assert all(len(set(row)) == len(row) == SPARSE_PRESENT for row in keys)
        ids = {k for row in keys for k in row}
        assert ids <= {str(i) for i in range(SPARSE_IDS)} and len(ids) > SPARSE_IDS // 2
        assert len({tuple(sorted(row)) for row in keys}) > 1000  # sets differ row by row
    # The shape otherwise: action names, possible actions as lists of names.
    assert table.column("possible_actions").to_pylist()[0] == ["0", "1"]


def test_pair_runs_resident_and_streamed_in_one_process(tmp_path: Path) -> None:
    data = make_table(tmp_path / "t.parquet", 4000, row_group=512)
    args = Namespace(
        root=str(tmp_path), device="cpu", batch=64, steps=0, epochs=3, window=1024,
        kind="dqn", layers="16,16", timeout=300,
    )  # fmt: skip
    result = run_child(data, "pair", args)
    assert len(result["resident"]) == len(result["streamed"]) == 2  # epochs after warm-up
    assert all(r > 0 for r in result["resident"] + result["streamed"])
    assert "streamed from disk" in result["data"] and "prepared units" in result["data"]
    assert result["stream_threads"] == 0


def test_units_mode_streams_the_host_side_alone_beside_its_floors(tmp_path: Path) -> None:
    """`--modes units`: the prepared stream's producer with no training step, each floor of
    the same data, where its time went and its memory, from a real child process."""
    data = make_table(tmp_path / "t.parquet", 6000, row_group=500)
    args = Namespace(
        root=str(tmp_path), device="cpu", batch=100, steps=20, epochs=3, window=2000,
        kind="dqn", layers="16,16", timeout=300,
    )  # fmt: skip
    result = run_child(data, "units", args)
    assert set(result["rates"]) == {"stream", "read", "sha256", "gather"}
    assert all(len(v) == 3 and min(v) > 0 for v in result["epochs"].values())
    assert result["rows_per_epoch"] == 2000 and result["stream_per_cpu_s"] > 0
    assert all(result["spent_s"][k] > 0 for k in ("load", "gather", "stage", "window"))
    assert result["row_bytes"] > 40 and result["window_mib"] > 0
    assert result["peak_rss_mib"] >= result["rss_before_stream_mib"] > 0
    assert "prepared units" in result["data"]


def test_read_ahead_depths_run_in_turn_each_labelled(tmp_path: Path) -> None:
    """`--read-ahead 1,2`: each streaming mode once per depth, in a real run of the
    benchmark (its child processes too); the depth reaches the child's stream."""
    data = make_table(tmp_path / "t.parquet", 4000, row_group=500)
    args = Namespace(
        root=str(tmp_path), device="cpu", batch=100, steps=10, epochs=2, window=1000,
        kind="dqn", layers="16,16", timeout=300, read_ahead="2",
    )  # fmt: skip
    assert ", 2 windows read ahead, " in run_child(data, "units", args)["data"]
    cmd = [sys.executable, "-m", "benchmarks.bench_stream", "--rows", "4000", "--row-group"]
    cmd += ["500", "--modes", "resident,prepared,units", "--batch", "100", "--steps", "10"]
    cmd += ["--epochs", "2", "--window", "1000", "--layers", "16,16", "--root", str(tmp_path)]
    proc = subprocess.run(
        [*cmd, "--read-ahead", "1,2"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for label in ("prepare (read ahead 1)", "prepared (read ahead 1)", "prepared (read ahead 2)"):
        assert any(line.startswith(f"| 4e+03 | {label} | ") for line in lines), proc.stdout
    # A streamed row says how long its step waited for rows and where its loads' time went.
    (prepared,) = [x for x in lines if x.startswith("| 4e+03 | prepared (read ahead 2) | ")]
    assert "s an epoch for rows) (window loads, s: read " in prepared, prepared
    assert ", order " in prepared and ", shuffle " in prepared and " windows) " in prepared
    (resident,) = [x for x in lines if x.startswith("| 4e+03 | resident | ")]
    assert "waited" not in resident and "window loads" not in resident
    for depth in (1, 2):
        units = [x for x in lines if f"| units (read ahead {depth}) (host only): stream " in x]
        assert len(units) == 1 and " /resident), " in units[0], proc.stdout
    bad = subprocess.run([*cmd, "--read-ahead", "1,0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "--read-ahead 1,0: '0' is neither \"auto\" nor a count from 1 to 64" in bad.stderr
