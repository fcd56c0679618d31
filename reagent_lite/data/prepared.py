"""Prepared data: a disk-streamed shard's units decoded once, read back as raw arrays.

Under `stream_from_disk` every window of every epoch used to go through Parquet decoding,
validation, tensorization and normalization again. With `stream_prepare: true` each unit
(one Parquet row group, `data/windows.py`) takes that way once: its training columns —
validated, conformed to the run's feature space, normalized — are written to one file of
fixed-width little-endian arrays behind a small JSON header (memory-mappable:
`read_arrays`); every later window that holds the unit, in this epoch, later epochs and
later runs, reads the arrays' bytes straight into the window's arrays (`read_into`: one
read per column from the page cache, cheaper than faulting a mapping in). A window is the
units' arrays end to end, exactly the arrays the unprepared path builds for it (rows are
normalized row by row, so normalizing a unit on its own gives the same bits as
normalizing it inside a window; the tests compare every bit).

Where: one directory per (code, kind, feature space, normalization, ingest settings) —
`settings.json` in it says which — holding one `<file>.<unit>.<digest>.prep` per unit,
under `stream_prepared_dir`, else `$REAGENT_LITE_PREPARED_DIR`, else
`$XDG_CACHE_HOME/reagent-lite/prepared` (default `~/.cache/reagent-lite/prepared`).

When it is rebuilt: a unit's file name carries a content digest of its source — SHA-256 of
the file's schema, what the metadata of the unit's row group(s) says that their bytes do
not (codecs, types, counts; not their byte offsets, which move when an earlier group
changes), which rows of them it is, and their bytes. Footers and sizes alone are cheap but
miss edits that keep every page size and min/max statistic (one value changed in an
incompressible column: a test shows one); the row group's own bytes cannot miss it, and
hashing them (SHA-256, hundreds of MB/s to GB/s a thread with the CPU's SHA instructions,
on the window-loading threads, once per unit per run) costs a fraction of decoding them.
The directory's digest covers the config values the arrays depend on (the feature space,
the normalization parameters, `Kind.ingest_settings`), the source code of the packages
that make the arrays (`data/`, `normalization/`, `kinds/`) and the torch / numpy /
pyarrow versions. Timestamps are never consulted. Nothing is ever deleted automatically:
remove the root (or one directory in it) to reclaim the space.

Writing is atomic: a unit is written to a hidden temporary file in the same directory,
flushed to disk and renamed over its final name, so a prepare killed midway leaves at most
a stray `.*.tmp` file, never a file that reads as valid. Nothing read back is trusted
(`data/prepared_format.py`): the header must be whole, of this key, match its checksum and
declare only plain numeric/bool columns inside the file, and every column's bytes are
hashed as they are read against the SHA-256 written with them (once per run while the
file stays the same: `prepared_format.FileId`); a file that fails is
refused with a warning naming it and its unit prepared again. Ranks, nodes or jobs preparing the same unit at once each
write their own temporary file and the last rename wins; their contents are identical.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor

from reagent_lite.data.prepared_format import (
    FORMAT,
    FileId,
    Tampered,
    file_id,
    read_header,
    read_into,
)
from reagent_lite.data.prepared_format import read_arrays as read_arrays  # for callers
from reagent_lite.data.prepared_format import write_arrays as write_arrays
from reagent_lite.data.readers import ShardPiece, parquet_file
from reagent_lite.data.windows import in_order, load_threads

log = logging.getLogger("reagent_lite")

ENV_DIR = "REAGENT_LITE_PREPARED_DIR"
# The packages whose code decides what a unit's arrays hold.
_CODE_PACKAGES = ("data", "normalization", "kinds")
_BLOCK = 1 << 22  # bytes hashed per read


def prepared_root(configured: str | None) -> Path:
    """Where prepared units go: `configured` (`stream_prepared_dir`), else the environment's
    `REAGENT_LITE_PREPARED_DIR`, else the user's cache directory."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "reagent-lite" / "prepared"


def code_digest() -> str:
    """Digest of the source of the packages that make a unit's arrays, and of the libraries'
    versions: a new version of either is a new directory, never stale arrays."""
    h = hashlib.sha256()
    for lib in (torch.__version__, np.__version__, pa.__version__, str(FORMAT)):
        h.update(lib.encode() + b"\0")
    root = Path(__file__).resolve().parent.parent  # the package: data/..
    for pkg in _CODE_PACKAGES:
        for path in sorted((root / pkg).glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


# ------------------------------------------------------------------------ content digests


def file_facts(path: Path) -> tuple[pq.FileMetaData, int, bytes]:
    """What every unit of a Parquet file shares in its digest: the footer's metadata, the
    file's size and its schema (column types, Arrow schema)."""
    md = parquet_file(path).metadata
    schema = [str(md.schema.column(i)) for i in range(len(md.schema))]
    extra = {k.hex(): v.hex() for k, v in (md.metadata or {}).items()}
    return md, path.stat().st_size, json.dumps([schema, extra], sort_keys=True).encode()


def _group(md: pq.FileMetaData, g: int) -> tuple[list[Any], int, int]:
    """Row group `g`: what its bytes do not say (codecs, types, row count), and the byte
    range of its column chunks (dictionary pages included)."""
    rg = md.row_group(g)
    lo, hi, facts = 1 << 62, 0, [rg.num_rows]
    for c in range(rg.num_columns):
        col = rg.column(c)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset:
            start = min(start, col.dictionary_page_offset)
        lo, hi = min(lo, start), max(hi, start + col.total_compressed_size)
        facts.append([col.path_in_schema, col.physical_type, col.compression, col.num_values])
    return facts, lo, hi


def _unit_groups(unit: ShardPiece, md: pq.FileMetaData) -> list[int]:
    if unit.kind == "row_groups":
        return list(unit.row_groups)
    if unit.kind == "file":
        return list(range(md.num_row_groups))
    stop = unit.row_stop if unit.row_stop is not None else md.num_rows
    groups, pos = [], 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if pos < stop and pos + n > unit.row_start:
            groups.append(g)
        pos += n
    return groups


def unit_digest(unit: ShardPiece, facts: tuple[pq.FileMetaData, int, bytes] | None = None) -> str:
    """The content digest of a unit's source (see the module notes): its file's schema,
    what its row groups' metadata says that their bytes do not (codecs, types, counts),
    which rows of them it is, and their bytes. Where a unit sits in its file, or its file
    on disk, does not count: the same row group in a rewritten or moved file is the same
    unit. `facts`: `file_facts(unit.file)`, when known."""
    md, size, schema = facts or file_facts(unit.file)
    groups = [_group(md, g) for g in _unit_groups(unit, md)]
    h = hashlib.sha256(schema + b"\0")
    rows = [unit.row_start, unit.row_stop] if unit.kind == "rows" else None
    h.update(json.dumps([rows, [g[0] for g in groups]]).encode() + b"\0")
    with unit.file.open("rb") as f:
        for _, lo, hi in groups:
            if not 0 <= lo < hi <= size:  # odd offsets: the whole file, then
                lo, hi = 0, size
            f.seek(lo)
            while lo < hi:
                block = f.read(min(_BLOCK, hi - lo))
                if not block:
                    break
                h.update(block)
                lo += len(block)
    return h.hexdigest()


def _unit_name(unit: ShardPiece) -> str:
    if unit.kind == "row_groups":
        return f"rg{unit.row_groups[0]}" if len(unit.row_groups) == 1 else "rgs"
    if unit.kind == "rows":
        return f"rows{unit.row_start}-{unit.row_stop}"
    return "file"


# ------------------------------------------------------------------------ the cache


class PreparedUnits:
    """A disk stream's window loader through prepared units (see the module notes).

    `prepare(unit)` is the unprepared way for one unit: its training columns. `settings`:
    everything besides a unit's source that its columns depend on (JSON-able).
    `load(units)` is then the window of `units`: each unit's file opened (prepared and
    written first when missing or stale, up to `threads` units at a time, the first
    failing unit's error raised as the unprepared load raises it), their arrays read end
    to end into the window's."""

    def __init__(
        self,
        root: Path,
        settings: Mapping[str, Any],
        prepare: Callable[[ShardPiece], dict[str, Tensor]],
        *,
        threads: int | None = None,
    ) -> None:
        blob = json.dumps({"code": code_digest(), **settings}, sort_keys=True, default=str)
        self.digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
        self.directory = root / self.digest
        self.prepare = prepare
        self.threads = load_threads() if threads is None else threads
        self._keys: dict[ShardPiece, str] = {}  # a unit's source digest, once per run
        self._files: dict[Path, tuple[pq.FileMetaData, int, bytes]] = {}  # file_facts
        # A unit's checked header, with the identity of the file it was read from.
        self._headers: dict[ShardPiece, tuple[FileId, _Part]] = {}
        self.headers_read = 0  # headers parsed and checked (not taken from `_headers`)
        self.bytes_checked = 0  # units whose bytes were hashed as they were read
        self._lock = threading.Lock()
        self.reused = self.prepared = 0  # units, counted as windows open them
        # Windows in page-locked memory: set for a stream whose windows go to a GPU, where a
        # copy from pinned memory runs asynchronously and 10-15% faster end to end (issue 39).
        self.pin_memory = False
        self.writable = self._make_directory(blob)

    def _make_directory(self, blob: str) -> bool:
        """Creates the directory (with `settings.json`, which says what its arrays are);
        False, with a warning, when it cannot be written: units are then prepared in memory
        for each window, as without a cache."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            settings = self.directory / "settings.json"
            if not settings.exists():
                tmp = self.directory / f".settings.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
                tmp.write_text(json.dumps(json.loads(blob), indent=1, sort_keys=True) + "\n")
                os.replace(tmp, settings)
            return True
        except OSError as e:
            log.warning(
                "stream_prepare: cannot write prepared data under %s (%s); every window "
                "is decoded from Parquet instead (set stream_prepared_dir to a writable "
                "directory)",
                self.directory,
                e,
            )
            return False

    def describe(self) -> str:
        return f"prepared units in {self.directory}"

    def path(self, unit: ShardPiece) -> tuple[Path, str]:
        """Where `unit` is prepared, and its key (its source's digest, once per run)."""
        key = self._keys.get(unit)
        if key is None:
            with self._lock:
                facts = self._files.get(unit.file)
            if facts is None:
                facts = file_facts(unit.file)
                with self._lock:
                    self._files[unit.file] = facts
            key = self._keys[unit] = unit_digest(unit, facts)
        return self.directory / f"{unit.file.name}.{_unit_name(unit)}.{key[:24]}.prep", key

    def _open(self, unit: ShardPiece) -> _Part:
        """`unit`'s prepared file (prepared first when missing, stale or refused)."""
        if not self.writable:
            return _Part(arrays={k: v.numpy() for k, v in self.prepare(unit).items()})
        path, key = self.path(unit)
        seen = self._headers.get(unit)
        if seen is not None and seen[0] == _file_id(path):
            # The same file as when its header was checked: only its arrays are read again
            # (hashed again if the file changed since they were: `read_into`). Parsing and
            # checking a header holds the GIL: every epoch, for every unit, it capped
            # streaming well below resident speed.
            with self._lock:
                self.reused += 1
            return seen[1]
        found = read_header(path, key)
        with self._lock:
            self.headers_read += 1
        if found is None:
            arrays = self._rebuild(unit, path, key)
            found = read_header(path, key)
            if found is None:  # not written (a full disk): train on, uncached
                return _Part(arrays=arrays)
            del arrays
        else:
            with self._lock:
                self.reused += 1
        part = _Part(path=path, columns=found[0], start=found[1])
        identity = _file_id(path)
        if identity is not None:
            self._headers[unit] = (identity, part)
        return part

    def _rebuild(self, unit: ShardPiece, path: Path, key: str) -> dict[str, np.ndarray]:
        """`unit` prepared and written to `path` (a warning when it cannot be): its arrays."""
        arrays = {k: v.numpy() for k, v in self.prepare(unit).items()}
        try:
            write_arrays(path, key, arrays)
        except OSError as e:  # a full disk: train on, uncached
            log.warning("stream_prepare: cannot write %s (%s)", path, e)
        with self._lock:
            self.prepared += 1
        return arrays

    def _fill(self, unit: ShardPiece, part: _Part, out: dict[str, np.ndarray]) -> None:
        """`part`'s arrays into `out`; a file whose bytes fail their checksums (changed
        after its header was read) is prepared again and its fresh arrays used."""
        try:
            if part.fill(out):
                with self._lock:
                    self.bytes_checked += 1
        except Tampered as e:
            log.warning("stream_prepare: %s; preparing it again", e)
            self._headers.pop(unit, None)
            path, key = self.path(unit)
            _Part(arrays=self._rebuild(unit, path, key)).fill(out)

    def load(self, units: Sequence[ShardPiece]) -> dict[str, Tensor]:
        """The window of `units`: their columns end to end (host tensors)."""
        parts = in_order(lambda i: self._open(units[i]), len(units), self.threads)
        offsets = np.cumsum([0] + [p.rows for p in parts]).tolist()
        window = {
            name: self._empty((offsets[-1], *shape), dtype)
            for name, (dtype, shape) in parts[0].layout().items()
        }

        def fill(i: int) -> None:
            lo, hi = offsets[i], offsets[i + 1]
            self._fill(units[i], parts[i], {k: v[lo:hi] for k, v in window.items()})

        in_order(fill, len(parts), self.threads)
        return {k: torch.from_numpy(v) for k, v in window.items()}

    def _empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        if not self.pin_memory:
            return np.empty(shape, dtype)
        like = torch.from_numpy(np.empty(0, dtype))  # the torch dtype of `dtype`
        return torch.empty(shape, dtype=like.dtype, pin_memory=True).numpy()


def _file_id(path: Path) -> FileId | None:
    try:
        return file_id(os.stat(path))
    except OSError:
        return None


@dataclass
class _Part:
    """One unit of a window: in its prepared file (`path`, the header's `columns`, where
    the arrays `start`), or in memory (`arrays`) when it could not be written."""

    path: Path | None = None
    columns: list[dict[str, Any]] = field(default_factory=list)
    start: int = 0
    arrays: dict[str, np.ndarray] | None = None
    verified: FileId | None = None  # the file whose bytes were last read and checked

    @property
    def rows(self) -> int:
        if self.arrays is not None:
            return int(next(iter(self.arrays.values())).shape[0])
        return int(self.columns[0]["shape"][0])

    def layout(self) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
        """Column → (dtype, shape of a row)."""
        if self.arrays is not None:
            return {k: (a.dtype, a.shape[1:]) for k, a in self.arrays.items()}
        return {c["name"]: (np.dtype(c["dtype"]), tuple(c["shape"][1:])) for c in self.columns}

    def fill(self, out: dict[str, np.ndarray]) -> bool:
        """Its arrays into `out`; whether bytes read from its file were hashed."""
        if self.arrays is not None:
            for k, a in self.arrays.items():
                out[k][...] = a
            return False
        assert self.path is not None
        self.verified, hashed = read_into(self.path, self.columns, self.start, out, self.verified)
        return hashed
