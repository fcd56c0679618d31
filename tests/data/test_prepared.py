"""Prepared units (`data/prepared.py`): the file format, content digests, the cache's
invalidation, atomic and concurrent writes, and disk-streamed training through it, bit for
bit the unprepared path."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pydantic import BaseModel
from torch import Tensor

from reagent_lite.config import BaseWorkflowConfig
from reagent_lite.data import prepared_format
from reagent_lite.data.prepared import (
    PreparedUnits,
    prepared_root,
    read_arrays,
    unit_digest,
    write_arrays,
)
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.windows import stream_units
from reagent_lite.distributed.context import DistContext
from reagent_lite.kinds import KINDS
from reagent_lite.normalization.params import NormalizationParameters, save_normalization
from reagent_lite.training.loop import Workflow
from tests.conftest import REPO_ROOT
from tests.data.test_disk_stream import load_window
from tests.data.test_ingest import rows, write
from tests.data.test_ingest_parametric import parametric_rows, write_parametric
from tests.training.test_disk_stream import _cfg, _pcfg, _run


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "state": rng.normal(size=(37, 5)).astype(np.float32),
        "action": rng.integers(0, 4, 37),
        "possible_actions": rng.normal(size=(37, 3, 2)).astype(np.float32),
        "mask": rng.random((37, 3)) > 0.5,
        "big_endian": np.arange(37, dtype=">f8"),
    }


def test_arrays_read_back_memory_mapped(tmp_path: Path) -> None:
    arrays = _arrays()
    write_arrays(tmp_path / "u.prep", "k1", arrays)
    got = read_arrays(tmp_path / "u.prep", "k1")
    assert got is not None and list(got) == list(arrays)
    for name, a in arrays.items():
        assert isinstance(got[name].base, np.memmap) or isinstance(got[name], np.memmap), name
        assert got[name].dtype == a.dtype.newbyteorder("<") and got[name].shape == a.shape
        np.testing.assert_array_equal(got[name], a)
        assert got[name].ctypes.data % prepared_format.ALIGN == 0
    assert read_arrays(tmp_path / "u.prep", "another key") is None
    assert read_arrays(tmp_path / "missing.prep", "k1") is None
    assert [p.name for p in tmp_path.iterdir()] == ["u.prep"]  # no temporary file left


def test_a_unit_is_read_in_one_call_gaps_and_all(tmp_path: Path) -> None:
    """`read_into` reads a unit's columns with one `preadv` (issue 39: one wait for the
    interpreter lock per unit): the same arrays as column by column, across the alignment
    gaps, whatever the order of the header's columns; overlapping columns fall back."""
    arrays = {k: v.astype(v.dtype.newbyteorder("<")) for k, v in _arrays().items()}
    path = tmp_path / "u.prep"
    write_arrays(path, "k1", arrays)
    found = prepared_format.read_header(path, "k1")
    assert found is not None
    columns, start = found
    ends = [c["at"] + arrays[c["name"]].nbytes for c in columns]
    assert any(c["at"] > end for c, end in zip(columns[1:], ends, strict=False))  # gaps
    for order in (columns, columns[::-1]):
        out = {k: np.full_like(v, 7) for k, v in arrays.items()}
        with path.open("rb", buffering=0) as f:
            assert prepared_format._read_at_once(f.fileno(), order, start, out)
        for k, v in arrays.items():
            np.testing.assert_array_equal(out[k], v)
        out = {k: np.zeros_like(v) for k, v in arrays.items()}
        ident, hashed = prepared_format.read_into(path, order, start, out)
        assert ident is not None and hashed
        for k, v in arrays.items():
            np.testing.assert_array_equal(out[k], v)
    overlap = [dict(columns[0]), {**columns[1], "at": columns[0]["at"]}]
    out = {k: np.zeros_like(v) for k, v in arrays.items()}
    with path.open("rb", buffering=0) as f:
        assert not prepared_format._read_at_once(f.fileno(), overlap, start, out)


@pytest.mark.parametrize("cut", [0, 5, 100, -1])
def test_a_file_cut_short_or_garbled_never_reads_as_valid(tmp_path: Path, cut: int) -> None:
    write_arrays(tmp_path / "u.prep", "k", _arrays())
    data = (tmp_path / "u.prep").read_bytes()
    (tmp_path / "u.prep").write_bytes(data[:cut] if cut >= 0 else data + b"\0")
    assert read_arrays(tmp_path / "u.prep", "k") is None


def test_a_failed_write_leaves_neither_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="No space"):
        write_arrays(tmp_path / "u.prep", "k", _arrays())
    assert list(tmp_path.iterdir()) == []


def test_digest_sees_a_value_changed_where_the_footer_does_not(tmp_path: Path) -> None:
    # One middle value of an incompressible column replaced: same sizes, same min/max
    # statistics, so the footers (all the metadata) are identical — the row group's bytes
    # are not.
    r = np.random.default_rng(0).normal(size=1000)
    edited = r.copy()
    order = np.argsort(r)
    edited[order[500]] = r[order[501]]
    pq.write_table(pa.table({"reward": r}), tmp_path / "a.parquet", row_group_size=250)
    pq.write_table(pa.table({"reward": edited}), tmp_path / "b.parquet", row_group_size=250)
    footers = [(tmp_path / f).read_bytes()[-1000:] for f in ("a.parquet", "b.parquet")]
    assert footers[0] == footers[1]
    a, b = (
        stream_units(str(tmp_path / "a.parquet"), 0, 1),
        stream_units(str(tmp_path / "b.parquet"), 0, 1),
    )
    changed = int(np.nonzero(edited != r)[0][0]) // 250
    for g in range(4):
        assert (unit_digest(a[g]) == unit_digest(b[g])) == (g != changed), g
    # Content-addressed: the same bytes under another path are the same units.
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "a.parquet").write_bytes((tmp_path / "a.parquet").read_bytes())
    copy = stream_units(str(tmp_path / "copy" / "a.parquet"), 0, 1)
    assert [unit_digest(u) for u in copy] == [unit_digest(u) for u in a]
    rows_unit = ShardPiece(a[0].file, "rows", row_start=100, row_stop=600, num_rows=500)
    assert unit_digest(rows_unit) not in {unit_digest(u) for u in a}


def test_root_from_config_environment_or_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAGENT_LITE_PREPARED_DIR", "/data/prep")
    assert prepared_root("~/x") == Path.home() / "x"
    assert prepared_root(None) == Path("/data/prep")
    monkeypatch.delenv("REAGENT_LITE_PREPARED_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/c")
    assert prepared_root(None) == Path("/c/reagent-lite/prepared")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert prepared_root(None) == Path.home() / ".cache" / "reagent-lite" / "prepared"


def _rewards(units: Sequence[ShardPiece]) -> dict[str, Tensor]:
    return {"reward": torch.from_numpy(load_window(units).fields["reward"])}


def test_units_prepared_once_then_reused_settings_make_another_directory(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "t.parquet", rows(300), 40)
    units = stream_units(str(path), 0, 1)
    calls: list[ShardPiece] = []

    def prepare(unit: ShardPiece) -> dict[str, Tensor]:
        calls.append(unit)
        return _rewards([unit])

    window = units[2:6]
    want = _rewards(window)["reward"]
    first = PreparedUnits(tmp_path / "cache", {"s": 1}, prepare, threads=2)
    assert torch.equal(first.load(window)["reward"], want)
    assert (first.prepared, first.reused, len(calls)) == (4, 0, 4)
    later = PreparedUnits(tmp_path / "cache", {"s": 1}, prepare, threads=2)  # a later run
    assert later.directory == first.directory
    assert torch.equal(later.load(window)["reward"], want)
    assert (later.prepared, later.reused, len(calls)) == (0, 4, 4)
    assert json.loads((later.directory / "settings.json").read_text())["s"] == 1
    other = PreparedUnits(tmp_path / "cache", {"s": 2}, prepare)
    assert other.directory != first.directory
    other.load(window)
    assert (other.prepared, len(calls)) == (4, 8)


@pytest.mark.gpu
def test_windows_for_a_gpu_are_read_into_pinned_memory(tmp_path: Path) -> None:
    """`pin_memory` (set for a stream whose windows go to a GPU): the same rows, in
    page-locked memory, so the copy to the device runs asynchronously (issue 39)."""
    path = write(tmp_path / "t.parquet", rows(300), 40)
    window = stream_units(str(path), 0, 1)[1:5]
    cache = PreparedUnits(tmp_path / "cache", {}, lambda u: _rewards([u]), threads=2)
    plain = cache.load(window)["reward"]
    cache.pin_memory = True
    pinned = cache.load(window)["reward"]
    assert pinned.is_pinned() and not plain.is_pinned()
    assert torch.equal(pinned, plain) and torch.equal(plain, _rewards(window)["reward"])


def test_headers_and_bytes_checked_once_per_run_again_when_the_file_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Later epochs take a unit's checked header from memory while its file is the same
    (parsing it every epoch held the GIL and capped streaming), and read its arrays without
    hashing them again (hashing every read cost more CPU than reading: issue 39); bytes
    changed in place, even with the file's times put back, are still caught (the change
    time moves); a file replaced by another is read and checked again."""
    path = write(tmp_path / "t.parquet", rows(300), 40)
    window = stream_units(str(path), 0, 1)[2:6]
    want = _rewards(window)["reward"]
    cache = PreparedUnits(tmp_path / "cache", {"s": 1}, lambda u: _rewards([u]), threads=2)
    for _ in range(3):
        assert torch.equal(cache.load(window)["reward"], want)
    assert cache.headers_read == 4  # once per unit (when it was prepared), never again
    assert cache.bytes_checked == 4  # each unit's bytes hashed when first read back
    unit = sorted(cache.directory.glob("*.prep"))[0]
    head, start = _header(unit)
    reward = next(c for c in head["columns"] if c["name"] == "reward")
    st = os.stat(unit)
    with unit.open("r+b") as f:  # overwrite the first reward in place ...
        f.seek(start + reward["at"])
        f.write(np.array([1e6], dtype=reward["dtype"]).tobytes())
    os.utime(unit, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and put its times back
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        assert torch.equal(cache.load(window)["reward"], want)
    assert "not what was written" in caplog.text
    read = cache.headers_read
    assert torch.equal(cache.load(window)["reward"], want)
    assert cache.headers_read == read + 1  # the rewritten file: its header checked again
    assert cache.bytes_checked == 4 + 1  # and its bytes, once


def test_unwritable_directory_warns_and_decodes_every_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "t.parquet", rows(100), 40)
    units = stream_units(str(path), 0, 1)
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        cache = PreparedUnits(tmp_path / "file" / "cache", {}, lambda u: _rewards([u]))
    assert not cache.writable and "cannot write prepared data" in caplog.text
    assert torch.equal(cache.load(units)["reward"], _rewards(units)["reward"])


# A process that prepares every unit of a table into a cache: two at once (ranks or jobs
# on the same data), or one killed while writing.
_PREPARE = """
import os, sys, time
from pathlib import Path
import torch
from reagent_lite.data import prepared_format
from reagent_lite.data.prepared import PreparedUnits
from reagent_lite.data.windows import stream_units
from tests.data.test_disk_stream import load_window

path, root, go, slow = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"
if slow:  # hold every written file before its rename (to be killed there)
    fsync = os.fsync
    os.fsync = lambda fd: (print("writing", flush=True), time.sleep(60), fsync(fd))
units = stream_units(path, 0, 1)
cache = PreparedUnits(
    root, {}, lambda u: {"reward": torch.from_numpy(load_window([u]).fields["reward"])}
)
while not go.exists():
    time.sleep(0.01)
print(cache.load(units)["reward"].sum().item(), cache.prepared, flush=True)
"""


def _prepare_process(path: Path, root: Path, go: Path, slow: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", _PREPARE, str(path), str(root), str(go), "1" if slow else "0"]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)


def test_two_processes_preparing_the_same_units_at_once(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(600), 40)
    go = tmp_path / "go"
    procs = [_prepare_process(path, tmp_path / "cache", go) for _ in range(2)]
    time.sleep(1)
    go.touch()
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0][0] == outs[1][0]  # the same rows
    assert int(outs[0][1]) + int(outs[1][1]) >= 15  # each unit prepared by one or both
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert sorted(p.suffix for p in files) == [".json"] + [".prep"] * 15  # no .tmp left
    again = PreparedUnits(tmp_path / "cache", {}, lambda u: pytest.fail("prepared again"))
    units = stream_units(str(path), 0, 1)
    assert torch.equal(again.load(units)["reward"], _rewards(units)["reward"])


def test_a_prepare_killed_while_writing_is_never_read_as_valid(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(120), 40)
    go = tmp_path / "go"
    go.touch()
    proc = _prepare_process(path, tmp_path / "cache", go, slow=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("writing")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    left = [p for p in (tmp_path / "cache").rglob("*") if p.suffix in (".tmp", ".prep")]
    assert left and {p.suffix for p in left} == {".tmp"}  # hidden partial files, no unit
    assert all(p.name.startswith(".") for p in left)
    units = stream_units(str(path), 0, 1)
    calls: list[ShardPiece] = []

    def prepare(unit: ShardPiece) -> dict[str, Tensor]:
        calls.append(unit)
        return _rewards([unit])

    cache = PreparedUnits(tmp_path / "cache", {}, prepare)
    assert torch.equal(cache.load(units)["reward"], _rewards(units)["reward"])
    assert len(calls) == 3


class _Recorder:
    """A config whose attribute reads are recorded as dotted paths."""

    def __init__(self, obj: BaseModel, seen: set[str], prefix: str = "") -> None:
        self._obj, self._seen, self._prefix = obj, seen, prefix

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        if isinstance(value, BaseModel):
            return _Recorder(value, self._seen, f"{self._prefix}{name}.")
        self._seen.add(self._prefix + name)
        return value


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_layout_reads_only_the_settings_in_the_prepared_key(tmp_path: Path, kind: str) -> None:
    """A config value the layout reads but the key leaves out would let a later run read
    units prepared under another value: the layout (schema, builder, conform) may read
    only `ingest_settings` and what the feature space holds."""
    cfg: BaseWorkflowConfig = (_cfg if kind == "dqn" else _pcfg)(tmp_path, tmp_path)
    k = KINDS[kind]
    space = k.space_type.from_json(
        {"state_feature_ids": ["0", "1"], "actions": ["L", "R"], "action_feature_ids": ["100"],
         "max_candidates": 3}
    )  # fmt: skip
    seen: set[str] = set()
    layout = k.layout(_Recorder(cfg, seen), space)  # type: ignore[arg-type]
    layout.builder(8, "x")
    assert seen - {"actions"} <= set(k.ingest_settings(cfg)), seen  # actions: in the space
    assert "drop_bad_rows" in seen


# ------------------------------------------------------------------- through the workflow


def _state_norm(path: Path) -> str:
    """Every kind of transform, so the bit-for-bit checks cover the non-affine ones."""
    params = {
        "0": NormalizationParameters(
            feature_type="BOXCOX", boxcox_lambda=0.4, boxcox_shift=6.0, mean=1.0, stddev=2.0
        ),
        "1": NormalizationParameters(
            feature_type="QUANTILE", quantiles=[-2.0, -0.5, 0.0, 0.3, 1.9]
        ),
        "2": NormalizationParameters(feature_type="PROBABILITY"),
        "3": NormalizationParameters(feature_type="ENUM", possible_values=[0.0, 1.0]),
        "7": NormalizationParameters(feature_type="BINARY"),
        "11": NormalizationParameters(feature_type="CONTINUOUS", mean=400.0, stddev=90.0),
    }
    save_normalization(path, params)
    return str(path)


def _stream_epochs(wf: Workflow, epochs: int = 2) -> list[dict[str, Tensor]]:
    assert wf.disk is not None
    wf.disk.configure(step_rows=32, steps_per_epoch=25)
    out = []
    for epoch in range(epochs):
        chunks = list(wf.disk.epoch_chunks(epoch))
        out.append({k: torch.cat([c[k] for c, _ in chunks]) for k in chunks[0][0]})
    return out


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_prepared_epochs_are_the_unprepared_epochs_bit_for_bit(tmp_path: Path, kind: str) -> None:
    """Two epochs' chunks (more rows than the shard: a second pass) from a cold cache, a
    warm one and no cache: the same columns, rows and bits."""
    if kind == "dqn":
        data = write(tmp_path / "t.parquet", rows(700, late_feature_at=660), 64)
        make, extra = _cfg, {"state_norm_data_path": _state_norm(tmp_path / "n.json")}
    else:
        table = parametric_rows(700, late_feature_at=660, long_lists_at=640)
        data, make, extra = write_parametric(tmp_path / "t.parquet", table, 64), _pcfg, {}
    runs, counts = {}, {}
    for name, prepare in [("cold", True), ("warm", True), ("plain", False)]:
        cfg = make(data, tmp_path / name, stream_prepare=prepare, **extra)
        wf = Workflow(cfg.workflow, cfg, DistContext.single("cpu"))
        wf.load_training_data()
        try:
            runs[name] = _stream_epochs(wf)
        finally:
            assert wf.disk is not None
            wf.disk.close()
        cache = wf.disk.prepared
        counts[name] = None if cache is None else (cache.prepared, cache.reused)
    assert counts["plain"] is None
    cold, warm = counts["cold"], counts["warm"]
    assert cold is not None and warm is not None
    assert cold[0] == 11 and warm[0] == 0 and warm[1] >= 11  # each row group prepared once
    for name in ("cold", "warm"):
        for got, want in zip(runs[name], runs["plain"], strict=True):
            assert list(got) == list(want)
            for col, t in want.items():
                assert got[col].dtype == t.dtype and torch.equal(got[col], t), (name, col)


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_trained_weights_prepared_equal_unprepared_bit_for_bit(tmp_path: Path, kind: str) -> None:
    if kind == "dqn":
        data, make = write(tmp_path / "t.parquet", rows(400), 48), _cfg
    else:
        data = write_parametric(tmp_path / "t.parquet", parametric_rows(400), 48)
        make = _pcfg
    states = {}
    for name, prepare in [("plain", False), ("cold", True), ("warm", True)]:
        wf = _run(make(data, tmp_path / name, stream_prepare=prepare, epochs=2))
        states[name] = wf.q_net.state_dict()
        assert (wf.disk is not None and wf.disk.prepared is not None) == prepare
        if name == "warm":
            assert wf.disk is not None and wf.disk.prepared is not None
            assert wf.disk.prepared.prepared == 0 and wf.disk.prepared.reused > 0
    for name in ("cold", "warm"):
        for key, value in states["plain"].items():
            assert torch.equal(states[name][key], value), (name, key)


def test_changed_data_or_normalization_prepares_again(tmp_path: Path) -> None:
    data = write(tmp_path / "t.parquet", rows(300), 64)
    norm = _state_norm(tmp_path / "n.json")

    def counts(**extra: Any) -> tuple[int, int, Path]:
        cfg = _cfg(data, tmp_path / "out", state_norm_data_path=norm, **extra)
        wf = Workflow(cfg.workflow, cfg, DistContext.single("cpu"))
        wf.load_training_data()
        assert wf.disk is not None and wf.disk.prepared is not None
        try:
            _stream_epochs(wf, 1)
        finally:
            wf.disk.close()
        return wf.disk.prepared.prepared, wf.disk.prepared.reused, wf.disk.prepared.directory

    first = counts()  # (prepared, reused, directory): 5 row groups, each read 2-3 times
    assert first[0] == 5
    assert counts()[:1] == (0,)
    # One reward changed (the file rewritten): only its row group is prepared again.
    edited = rows(300)
    edited[70]["reward"] += 1.0
    write(data, edited, 64)
    again = counts()
    assert again[0] == 1 and again[2] == first[2]
    # Other normalization parameters, another ingest setting: another directory.
    save_normalization(
        Path(norm),
        {f: NormalizationParameters(feature_type="CONTINUOUS", mean=0.0, stddev=2.0)
         for f in ["0", "1", "2", "3", "7"]},
    )  # fmt: skip
    renormed = counts()
    assert renormed[0] == 5 and renormed[2] != first[2]
    dropping = counts(drop_bad_rows=True)
    assert dropping[0] == 5 and dropping[2] not in (first[2], renormed[2])


# ------------------------------------------------------------------- untrusted files


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """A prepared file's JSON header and where its arrays start."""
    data = path.read_bytes()
    lead = len(prepared_format.MAGIC) + 8
    length = int.from_bytes(data[len(prepared_format.MAGIC) : lead], "little")
    return json.loads(data[lead : lead + length]), lead + length


def test_a_value_overwritten_in_a_prepared_file_is_caught_and_prepared_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rewards overwritten in place (same length, header intact): a warning naming the
    file, the unit prepared again, and the run trains to the untampered run's weights."""
    data = write(tmp_path / "t.parquet", rows(400), 48)
    plain = _run(_cfg(data, tmp_path / "plain", stream_prepare=False, epochs=2))
    cache = str(tmp_path / "cache")
    _run(_cfg(data, tmp_path / "cold", stream_prepared_dir=cache, epochs=2))
    files = sorted((tmp_path / "cache").rglob("*.prep"))
    assert files
    head, start = _header(files[3])
    reward = next(c for c in head["columns"] if c["name"] == "reward")
    raw = bytearray(files[3].read_bytes())
    values = np.full(reward["shape"][0], 1e6, dtype=reward["dtype"]).tobytes()
    raw[start + reward["at"] : start + reward["at"] + len(values)] = values
    files[3].write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        warm = _run(_cfg(data, tmp_path / "warm", stream_prepared_dir=cache, epochs=2))
    assert str(files[3]) in caplog.text and "not what was written" in caplog.text
    for key, value in plain.q_net.state_dict().items():
        assert torch.equal(warm.q_net.state_dict()[key], value), key
    assert prepared_format.read_header(files[3], head["key"]) is not None  # rewritten whole
    assert _header(files[3])[0] == head


# Loads the units of a table through a cache one of whose files declares an object dtype
# (its header checksum made to match): refused and prepared again, never read as pointers.
_OBJECT_DTYPE = """
import json, sys
from pathlib import Path
import torch
from reagent_lite.data import prepared_format
from reagent_lite.data.prepared import PreparedUnits
from reagent_lite.data.windows import stream_units
from tests.data.test_disk_stream import load_window

path, root = sys.argv[1], Path(sys.argv[2])
units = stream_units(path, 0, 1)


def make(units):
    fields = load_window(units).fields
    return {k: torch.from_numpy(fields[k]) for k in ("reward", "mdp_id")}


PreparedUnits(root, {}, lambda u: make([u])).load(units)
unit = next(root.rglob("*.rg0.*.prep"))  # the first: its header lays out the window
raw = unit.read_bytes()
lead = len(prepared_format.MAGIC) + 8
length = int.from_bytes(raw[len(prepared_format.MAGIC) : lead], "little")
head = json.loads(raw[lead : lead + length])
col = next(c for c in head["columns"] if c["name"] == "mdp_id")
col["dtype"] = "|O"  # int64 ids as 8-byte pointers: same bytes, same checksum
head["check"] = prepared_format._header_sha(head["key"], head["columns"])
unit.write_bytes(raw[:lead] + json.dumps(head).encode().ljust(length) + raw[lead + length :])
cache = PreparedUnits(root, {}, lambda u: make([u]))
got, parts = cache.load(units), [make([u]) for u in units]
want = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
assert all(torch.equal(got[k], want[k]) for k in want), "wrong values"
print("prepared", cache.prepared, flush=True)
"""


def test_a_header_declaring_an_object_dtype_is_refused_without_a_crash(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(120), 40)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", _OBJECT_DTYPE, str(path), str(tmp_path / "cache")]
    done = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]  # a segfault is -11
    assert "prepared 1" in done.stdout
    assert "has dtype '|O', not a plain number" in done.stderr
