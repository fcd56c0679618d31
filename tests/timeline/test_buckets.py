"""The local engine's sort (`buckets.py`): spilled buckets give the order of one bucket held
in memory, at one level or more, whatever the ids; runs hold whole episodes."""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_timeline import step_log
from reagent_lite.timeline import buckets
from reagent_lite.timeline.buckets import SortSettings, sorted_runs
from reagent_lite.timeline.duck import DuckSettings, connect, eval_flags, open_steps
from reagent_lite.timeline.query import Side, episode_hash
from tests.timeline.conftest import write_parts

SIDES: tuple[Side, ...] = ("train", "eval")


def run_sides(src: Path, tmp_path: Path, memory_limit: int, run_rows: int = 500) -> dict:
    """Each side's sorted steps (as Python rows) and `has_next` flags, from `sorted_runs`
    with this memory limit; and the number of spill files each pass made."""
    rows: dict[str, list] = {side: [] for side in SIDES}
    has_next: dict[str, list] = {side: [] for side in SIDES}
    with connect(DuckSettings(threads=2)) as con:
        _, scan = open_steps(con, src)
        settings = SortSettings(memory_limit, tmp_path / "spill", run_rows)
        for run in sorted_runs(scan, SIDES, eval_flags(con, 0.3, 5), settings):
            table = pa.Table.from_batches([run.steps]).cast(_plain(run.steps.schema))
            rows[run.side] += table.to_pylist()
            has_next[run.side] += run.has_next.tolist()
    return {"rows": rows, "has_next": has_next}


def _plain(schema: pa.Schema) -> pa.Schema:
    from reagent_lite.timeline.scan import plain_schema

    return plain_schema(schema)


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    """~20k steps of 1,000 episodes over 4 Parquet files."""
    table = step_log(np.random.default_rng(11), 0, 1_000)
    return write_parts(table, tmp_path_factory.mktemp("log") / "steps", parts=4)


def test_spilled_buckets_give_the_order_of_one_bucket_in_memory(log, tmp_path, monkeypatch):
    passes: list[int] = []
    partition = buckets._partition

    def counted(scan, bounds, settings, depth):
        passes.append(len(bounds) + 1)
        yield from partition(scan, bounds, settings, depth)

    monkeypatch.setattr(buckets, "_partition", counted)
    held = run_sides(log, tmp_path / "held", 2**30)
    assert passes == []  # fits: one bucket, nothing spilled
    spilled = run_sides(log, tmp_path / "spilled", 2_000_000)  # ~3.5 MB of steps
    assert len(passes) == 1 and passes[0] >= 5
    assert spilled == held
    train = held["rows"]["train"]
    keys = [(r["mdp_id"], r["sequence_number"]) for r in train]
    assert keys == sorted(keys) and len(keys) > 10_000
    # The side is the SQL's hash split: every eval episode below the threshold.
    assert all(episode_hash(r["mdp_id"], 5) < 0.3 * 2**64 for r in held["rows"]["eval"])
    assert not any((tmp_path / "spilled" / "spill" / "level-0").iterdir())  # files removed


def test_buckets_too_large_for_one_pass_are_split_again(log, tmp_path, monkeypatch):
    monkeypatch.setattr(buckets, "_MAX_BUCKETS", 2)  # each pass splits in two
    held = run_sides(log, tmp_path / "held", 2**30)
    deep = run_sides(log, tmp_path / "deep", 1_000_000)
    assert deep == held
    levels = sorted(p.name for p in (tmp_path / "deep" / "spill").iterdir())
    assert levels[:3] == ["level-0", "level-1", "level-2"]


def test_one_episode_larger_than_a_bucket_is_held_whole(tmp_path):
    # 90% of the rows are one episode: no bound can split it; the sort still ends.
    big = step_log(np.random.default_rng(12), 0, 50)
    ids = np.array(big.column("mdp_id").to_pylist(), dtype=object)
    ids[: int(0.9 * len(ids))] = "ep-big"
    seq = np.arange(len(ids))
    big = big.set_column(0, "mdp_id", pa.array(ids.tolist()))
    big = big.set_column(1, "sequence_number", pa.array(seq))
    src = tmp_path / "steps.parquet"
    pq.write_table(big, src)
    held = run_sides(src, tmp_path / "held", 2**30)
    spilled = run_sides(src, tmp_path / "spilled", 50_000)
    assert spilled == held
    assert sum(len(r) for r in held["rows"].values()) == big.num_rows


@pytest.mark.parametrize("memory_limit", [2**30, 2_000_000])
def test_runs_hold_whole_episodes(log, tmp_path, memory_limit: int):
    with connect(DuckSettings(threads=2)) as con:
        _, scan = open_steps(con, log)
        settings = SortSettings(memory_limit, tmp_path / "spill", 7)
        runs = list(sorted_runs(scan, ["all"], None, settings))
    for before, after in itertools.pairwise(runs):
        assert before.steps.column("mdp_id")[-1] != after.steps.column("mdp_id")[0]
    for run in runs:
        ids = run.steps.column("mdp_id").to_pylist()
        assert run.has_next.tolist() == [a == b for a, b in zip(ids, [*ids[1:], None], strict=True)]
    if memory_limit == 2**30:  # one bucket: only the last run may be short
        assert all(run.steps.num_rows >= 7 for run in runs[:-1])


@pytest.mark.parametrize("kind", ["string", "int", "dictionary"])
def test_bucket_of_is_a_binary_search_over_the_bounds(kind):
    rng = np.random.default_rng(3)
    values = [f"ep-{v}" for v in rng.integers(0, 10_000, 2_000)]
    if kind == "int":
        values = [int(v[3:]) for v in values]
    bounds = sorted(set(values[:37]))
    ids = pa.array([*values, None])
    if kind == "dictionary":
        ids = ids.dictionary_encode()
    got = buckets._bucket_of(ids, pa.array(bounds))
    want = [bisect.bisect_right(bounds, v) for v in values] + [0]
    assert got.tolist() == want


def test_id_ranks_order_ids_bytewise_and_merge_repeated_dictionary_values():
    # A dictionary may hold a value twice (as after concatenating chunks): one rank.
    ids = pa.DictionaryArray.from_arrays(
        pa.array([0, 1, 2, 3, None, 2]), pa.array(["b", "a", "é", "a"])
    )
    assert buckets._id_ranks(ids).tolist() == [1, 0, 2, 0, -1, 2]
    assert buckets._id_ranks(pa.array(["b", "B", "a"])).tolist() == [2, 0, 1]


def test_order_beyond_32_bit_sequence_gaps_is_the_same_order():
    codes = np.array([1, 0, 1, 0, 2])
    small = np.array([5, 9, 3, 1, 0])
    huge = small * 2**40 - 2**62
    want = [3, 1, 2, 0, 4]
    assert buckets._order(codes, small).tolist() == want
    assert buckets._order(codes, huge).tolist() == want


def test_a_stop_ends_the_partition_pass_at_the_next_batch(log, tmp_path):
    # Ctrl-C during a long partition pass: the sort stops within a batch, not at its end.
    import threading

    from reagent_lite.timeline.buckets import Stopped

    stop = threading.Event()
    read = []
    with connect(DuckSettings(threads=2)) as con:
        _, scan = open_steps(con, log)
        batches = scan.batches

        def counted(columns=None):
            for batch in batches(columns):
                read.append(batch.num_rows)
                if len(read) == 6:  # 1 held, 4 for the bounds, then the partition pass
                    stop.set()
                yield batch

        scan.batches = counted  # type: ignore[method-assign]
        settings = SortSettings(200_000, tmp_path / "spill", 500, stop)
        with pytest.raises(Stopped):
            list(sorted_runs(scan, ["all"], None, settings))
    assert len(read) == 6


def _wide_and_narrow(tmp_path: Path, narrow_first: bool) -> Path:
    """Two files of one log: 1,000 episodes of rows without features, 5,000 of rows with
    40 (≈ 1 kB each); the narrow file first or last."""
    base = step_log(np.random.default_rng(13), 0, 6_000)
    ids = np.array([int(m[3:]) for m in base.column("mdp_id").to_pylist()])
    fmap = base.schema.field("state_features").type
    n = base.num_rows
    wide = pa.array([{str(j): float(j) for j in range(40)}] * n, fmap)
    base = base.set_column(2, "state_features", wide)
    narrow = base.filter(pa.array(ids < 1_000))
    narrow = narrow.set_column(2, "state_features", pa.array([{}] * narrow.num_rows, fmap))
    parts = [narrow, base.filter(pa.array(ids >= 1_000))]
    folder = tmp_path / ("narrow-first" if narrow_first else "wide-first")
    folder.mkdir()
    for k, part in enumerate(parts if narrow_first else parts[::-1]):
        pq.write_table(part, folder / f"part-{k}.parquet", row_group_size=2_000)
    return folder


@pytest.mark.parametrize("narrow_first", [True, False])
def test_buckets_stay_within_the_budget_whatever_rows_come_first(
    tmp_path, monkeypatch, narrow_first
):
    # The decision to spill follows the bytes held, not an estimate from the first rows.
    loaded: list[int] = []
    loader = buckets._loader

    def sized(batches):
        load = loader(batches)

        def measured():
            table = load()
            loaded.append(table.nbytes)
            return table

        return measured

    monkeypatch.setattr(buckets, "_loader", sized)
    src = _wide_and_narrow(tmp_path, narrow_first)
    limit = 16_000_000
    got = run_sides(src, tmp_path / "spill", limit)
    assert len(loaded) > 4 and max(loaded) <= limit / 2
    assert got == run_sides(src, tmp_path / "held", 2**30)


def test_a_bucket_never_holds_more_than_its_cap(log, tmp_path, monkeypatch):
    # Whatever the limit: a column of a bucket is one array with 32-bit offsets (2 GiB).
    monkeypatch.setattr(buckets, "_MAX_BUCKET_BYTES", 1_000_000)
    loaded: list[int] = []
    loader = buckets._loader
    monkeypatch.setattr(
        buckets,
        "_loader",
        lambda batches: loaded.append(sum(b.nbytes for b in batches)) or loader(batches),
    )
    got = run_sides(log, tmp_path / "capped", 2**40)
    assert len(loaded) > 2 and max(loaded) <= 1_000_000 + 400_000  # a batch over, at most
    monkeypatch.setattr(buckets, "_MAX_BUCKET_BYTES", 2**30)
    assert got == run_sides(log, tmp_path / "held", 2**40)


def test_nan_ids_sort_last_spilled_or_held(tmp_path):
    table = step_log(np.random.default_rng(14), 0, 400)
    ids = np.array([float(m[3:]) for m in table.column("mdp_id").to_pylist()])
    ids[ids == 7] = np.nan  # one whole episode with a NaN id (NaN ids are one episode)
    table = table.set_column(0, "mdp_id", pa.array(ids))
    src = tmp_path / "steps.parquet"
    pq.write_table(table, src)
    held = run_sides(src, tmp_path / "held", 2**30)
    spilled = run_sides(src, tmp_path / "spilled", 200_000)

    def ids(result: dict) -> dict:  # NaN != NaN: compare the ids as text
        return {side: [str(r["mdp_id"]) for r in rows] for side, rows in result["rows"].items()}

    assert ids(spilled) == ids(held)
    rows = ids(held)["train"] + ids(held)["eval"]
    assert "nan" in rows
    for side in ("train", "eval"):  # NaN last on its side
        side_ids = ids(held)[side]
        if "nan" in side_ids:
            assert set(side_ids[side_ids.index("nan") :]) == {"nan"}
    assert buckets._bucket_of(pa.array([np.nan, 1.0, None]), pa.array([0.5, 2.0])).tolist() == [
        2,
        1,
        0,
    ]
