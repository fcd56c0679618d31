"""Reading the logged-transition table, one rank's shard at a time.

Sharding rule, with world size W and the sorted list of data files:

1. at least W files: whole files, round-robin — rank r reads files r, r+W, r+2W, ...;
2. fewer files, Parquet, at least W row groups in all: row groups (numbered across the files
   in order), round-robin the same way;
3. otherwise row ranges: Parquet — rank r reads rows [r·N/W, (r+1)·N/W) of the files laid
   end to end (only the row groups that overlap, streamed in batches); JSON Lines — each rank
   is given one file (rank r → file r mod n) and the ranks sharing a file split its rows
   evenly (the file is scanned, but only its slice is parsed).

With several ranks, files that hold no rows (Spark's empty part files; an empty JSON
Lines file) are left out before the rule is applied. No rank materialises rows outside
its shard. Row counts come from Parquet footers; JSON
Lines counts are unknown until read (shown as "?" in the plan).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from reagent_lite.data.arrow import structs_as_maps
from reagent_lite.data.jsonl import first_record_keys, read_jsonl
from reagent_lite.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSED_SUFFIXES = (".gz", ".bz2")
# Column aliases accepted in the input and renamed on read: alias → canonical name.
ALIASES = {"propensity": "action_probability"}

Format = Literal["parquet", "jsonl"]


def file_format(path: Path) -> Format:
    """ "parquet" or "jsonl", from the suffix (Spark's suffix-less `part-*` files are Parquet)."""
    name = path.name.lower()
    for comp in COMPRESSED_SUFFIXES:
        if name.endswith(comp):
            name = name[: -len(comp)]
    if name.endswith(JSON_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES) or name.startswith("part-"):
        return "parquet"
    raise DataError(
        f"{path}: unknown data file type (expected .parquet, part-*, .jsonl/.json[.gz|.bz2])"
    )


def _is_data_file(p: Path) -> bool:
    try:
        file_format(p)
    except DataError:
        return False
    return True


def list_data_files(path: str | Path) -> list[Path]:
    """The data files behind `path`: the file itself, or the data files under a directory
    (recursively, so Hive-partitioned `key=value/` folders work), sorted; hidden files and
    Spark/Hadoop markers (`_SUCCESS`, `_metadata`, `.crc`) are skipped."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: data path does not exist")
    if p.is_file():
        file_format(p)  # raises on an unknown type
        return [p]
    files = sorted(
        f
        for f in p.rglob("*")
        if f.is_file()
        and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts)
        and _is_data_file(f)
    )
    if not files:
        raise DataError(f"{p}: directory holds no data files (*.parquet, part-*, *.jsonl)")
    formats = {file_format(f) for f in files}
    if len(formats) > 1:
        raise DataError(f"{p}: directory mixes Parquet and JSON Lines files; use one format")
    return files


# ----------------------------------------------------------------------------- shard plan


@dataclass(frozen=True)
class ShardPiece:
    """One contiguous part of one file: whole file, some row groups, or a row range."""

    file: Path
    kind: Literal["file", "row_groups", "rows"]
    row_groups: tuple[int, ...] = ()
    row_start: int = 0
    row_stop: int | None = None  # None = to the end
    num_rows: int | None = None  # None = unknown until read (JSON Lines)
    # For "rows" pieces of a JSON Lines file: this rank's part out of `parts` of the file.
    part: tuple[int, int] | None = None

    def describe(self) -> str:
        rows = "?" if self.num_rows is None else f"{self.num_rows:,}"
        if self.kind == "file":
            what = "whole file"
        elif self.kind == "row_groups":
            what = f"row groups {list(self.row_groups)}"
        elif self.part is not None:
            what = f"rows part {self.part[0] + 1}/{self.part[1]}"
        else:
            what = f"rows [{self.row_start:,}, {self.row_stop:,})"
        return f"{self.file.name}: {what} ({rows} rows)"


@dataclass(frozen=True)
class ShardSpec:
    """What one rank reads."""

    rank: int
    world_size: int
    pieces: tuple[ShardPiece, ...] = field(default=())

    @property
    def num_rows(self) -> int | None:
        counts = [p.num_rows for p in self.pieces]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def files(self) -> list[Path]:
        return list(dict.fromkeys(p.file for p in self.pieces))

    def __repr__(self) -> str:
        rows = "?" if self.num_rows is None else f"{self.num_rows:,}"
        head = f"rank {self.rank}/{self.world_size}: {rows} rows"
        if not self.pieces:
            return head + " (empty shard)"
        return head + "".join(f"\n  {p.describe()}" for p in self.pieces)

    __str__ = __repr__


def parquet_file(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from e


def shard_plan(path: str | Path, world_size: int, *, count_rows: bool = True) -> list[ShardSpec]:
    """What each of `world_size` ranks reads (see the module docstring for the rule).

    With whole files per rank, `count_rows=False` skips opening every file's footer just
    to count rows (`read_shard` needs no counts then)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    files = list_data_files(path)
    parquet = file_format(files[0]) == "parquet"
    if world_size > 1:
        files = _with_rows(files, parquet)
    if len(files) >= world_size:
        pieces = _whole_files(files, world_size, count_rows and parquet)
    elif not parquet:
        pieces = _jsonl_parts(files, world_size)
    else:
        metas = [(f, parquet_file(f).metadata) for f in files]
        if sum(m.num_row_groups for _, m in metas) >= world_size:
            pieces = _row_groups(metas, world_size)
        else:
            pieces = _row_ranges(metas, world_size)
    return [ShardSpec(r, world_size, tuple(p)) for r, p in enumerate(pieces)]


def _with_rows(files: list[Path], parquet: bool) -> list[Path]:
    """`files` without those that hold no rows (Spark writes empty part files): a rank
    handed one would have an empty shard. All empty: left as they are, for the reader's
    error."""
    if parquet:
        kept = [f for f in files if parquet_file(f).metadata.num_rows > 0]
    else:
        kept = [f for f in files if f.stat().st_size > 0]
    return kept or files


def _whole_files(files: list[Path], w: int, count_rows: bool) -> list[list[ShardPiece]]:
    pieces: list[list[ShardPiece]] = [[] for _ in range(w)]
    for i, f in enumerate(files):
        n = parquet_file(f).metadata.num_rows if count_rows else None
        pieces[i % w].append(ShardPiece(f, "file", num_rows=n))
    return pieces


def _jsonl_parts(files: list[Path], w: int) -> list[list[ShardPiece]]:
    """Rank r → file r mod n, its rows split evenly between the ranks sharing it."""
    pieces = []
    for r in range(w):
        f_idx = r % len(files)
        sharing = len(range(f_idx, w, len(files)))
        pieces.append([ShardPiece(files[f_idx], "rows", part=(r // len(files), sharing))])
    return pieces


def _row_groups(metas: list[tuple[Path, Any]], w: int) -> list[list[ShardPiece]]:
    """Row groups numbered across the files, round-robin."""
    groups = [(f, g, m.row_group(g).num_rows) for f, m in metas for g in range(m.num_row_groups)]
    by_rank: list[dict[Path, list[tuple[int, int]]]] = [{} for _ in range(w)]
    for i, (f, g, n) in enumerate(groups):
        by_rank[i % w].setdefault(f, []).append((g, n))
    return [
        [
            ShardPiece(f, "row_groups", tuple(g for g, _ in gs), num_rows=sum(n for _, n in gs))
            for f, gs in mine.items()
        ]
        for mine in by_rank
    ]


def _row_ranges(metas: list[tuple[Path, Any]], w: int) -> list[list[ShardPiece]]:
    """Row ranges over the files laid end to end."""
    total = sum(m.num_rows for _, m in metas)
    starts = [sum(m.num_rows for _, m in metas[:i]) for i in range(len(metas))]
    pieces: list[list[ShardPiece]] = [[] for _ in range(w)]
    for r in range(w):
        lo, hi = r * total // w, (r + 1) * total // w
        for (f, m), start in zip(metas, starts, strict=True):
            a, b = max(lo, start), min(hi, start + m.num_rows)
            if a < b:
                pieces[r].append(
                    ShardPiece(f, "rows", row_start=a - start, row_stop=b - start, num_rows=b - a)
                )
    return pieces


# ----------------------------------------------------------------------------- reading


def _resolve_columns(names: Sequence[str], columns: Sequence[str] | None) -> list[str] | None:
    """The file's columns to read for the requested ones (aliases included; absent ones are
    left out — validation reports missing required columns)."""
    if columns is None:
        return None
    wanted = set(columns)
    wanted |= {alias for alias, canon in ALIASES.items() if canon in wanted}
    return [n for n in names if n in wanted]


def apply_aliases(table: pa.Table, source: Path) -> pa.Table:
    """`table` with aliased columns (`ALIASES`) renamed (both names at once is an error)
    and struct columns of numeric fields read as maps (`structs_as_maps`: pandas writes
    dict cells so)."""
    table = structs_as_maps(table)
    names = table.column_names
    for alias, canon in ALIASES.items():
        if alias in names:
            if canon in names:
                raise DataError(f"{source}: has both '{canon}' and its alias '{alias}'; keep one")
            names = [canon if n == alias else n for n in names]
    return table.rename_columns(names) if names != table.column_names else table


def open_parquet(path: Path, extra_dictionary_columns: Sequence[str] = ()) -> pq.ParquetFile:
    """A ParquetFile whose map keys decode as dictionaries: feature ids repeat on every row,
    and decoding them as dictionary codes instead of millions of strings makes reading and
    tensorizing sparse features about ten times faster. String columns (or list elements)
    under the top-level `extra_dictionary_columns` decode as dictionaries too."""
    pf = parquet_file(path)
    keys = [
        c.path
        for c in (pf.schema.column(i) for i in range(len(pf.schema)))
        if c.physical_type == "BYTE_ARRAY"
        and (
            c.path.endswith(".key_value.key")
            or (
                c.path.split(".")[0] in extra_dictionary_columns and c.logical_type.type == "STRING"
            )
        )
    ]
    if not keys:
        return pf
    try:
        return pq.ParquetFile(path, read_dictionary=keys)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from e


def _empty(pf: pq.ParquetFile, cols: list[str] | None) -> pa.Table:
    schema = pf.schema_arrow
    if cols is not None:
        schema = pa.schema([schema.field(c) for c in cols])
    return schema.empty_table()


def _read_parquet_piece(piece: ShardPiece, columns: Sequence[str] | None) -> pa.Table:
    pf = open_parquet(piece.file)
    cols = _resolve_columns(pf.schema_arrow.names, columns)
    try:
        if piece.kind in ("file", "row_groups"):
            wanted = piece.row_groups if piece.kind == "row_groups" else range(pf.num_row_groups)
            # One row group at a time: pyarrow cannot return dictionary-keyed maps spanning
            # several row groups from a single read call.
            parts = [pf.read_row_group(g, columns=cols) for g in wanted]
            return pa.concat_tables(parts) if parts else _empty(pf, cols)
        batches = list(iter_parquet_rows(pf, piece, cols))
        return pa.Table.from_batches(batches) if batches else _empty(pf, cols)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{piece.file}: cannot read Parquet data ({e})") from e


def iter_parquet_rows(
    pf: pq.ParquetFile, piece: ShardPiece, cols: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of a "rows" piece: only the overlapping row groups are read, streamed in
    batches so that a single huge row group is never held whole."""
    stop = piece.row_stop if piece.row_stop is not None else pf.metadata.num_rows
    start = piece.row_start
    md = pf.metadata
    groups: list[int] = []
    first_row = 0  # first row of the first selected group
    pos = 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if pos < stop and pos + n > start:
            if not groups:
                first_row = pos
            groups.append(g)
        pos += n
    if not groups:
        return
    pos = first_row
    # One row group per call: a batch that spans row groups makes pyarrow join their
    # dictionaries, which it cannot do for dictionary-read list/map columns ("Nested data
    # conversions not implemented for chunked array outputs").
    for g in groups:
        for batch in pf.iter_batches(batch_size=65536, row_groups=[g], columns=cols):
            a, b = max(start, pos), min(stop, pos + batch.num_rows)
            if a < b:
                yield batch.slice(a - pos, b - a)
            pos += batch.num_rows
            if pos >= stop:
                return


def read_piece(piece: ShardPiece, columns: Sequence[str] | None = None) -> pa.Table:
    """One piece of a shard, aliases renamed."""
    if file_format(piece.file) == "parquet":
        table = _read_parquet_piece(piece, columns)
    else:
        table = read_jsonl(piece.file, piece.part)
        cols = _resolve_columns(table.column_names, columns)
        table = table if cols is None else table.select(cols)
    return apply_aliases(table, piece.file)


def _concat(tables: list[pa.Table], source: str) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as e:
        raise DataError(f"{source}: data files have incompatible schemas ({e})") from e


def read_shard(
    path: str | Path, rank: int, world_size: int, columns: Sequence[str] | None = None
) -> pa.Table:
    """Rank `rank`'s shard of the table at `path` (see the module docstring for the rule).

    `columns` limits what is read (aliases such as `propensity` are found and renamed);
    requested columns a file lacks are left out. A shard may be empty (more ranks than rows);
    validation reports that.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    spec = shard_plan(path, world_size, count_rows=False)[rank]
    if not spec.pieces:
        # More ranks than rows: an empty table with the file's schema.
        first = list_data_files(path)[0]
        return read_piece(ShardPiece(first, "rows", row_start=0, row_stop=0), columns).slice(0, 0)
    return _concat([read_piece(p, columns) for p in spec.pieces], str(path))


def empty_like(path: str | Path) -> tuple[pa.Table, bool]:
    """A zero-row table with the columns of the first data file at `path`, without reading
    its rows (for `--dry_run`), and whether its column types are known: Parquet files carry
    a schema; for JSON Lines only the first record's keys are read (types come from rows)."""
    first = list_data_files(path)[0]
    if file_format(first) == "parquet":
        table = _empty(parquet_file(first), None)
        return apply_aliases(table, first), True
    table = pa.table({name: pa.nulls(0) for name in first_record_keys(first)})
    return apply_aliases(table, first), False


def read_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """The whole table (a table `predict` scores; training and eval tables are ingested
    row group by row group, `data/ingest.py`)."""
    return read_shard(path, 0, 1, columns)
