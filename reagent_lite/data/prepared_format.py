"""The file format of a prepared unit (`data/prepared.py`): fixed-width arrays behind a
JSON header, checked before any byte of it is used.

A prepared file sits in a cache directory that other users, jobs or nodes may be able to
write, so nothing in it is trusted: the header is refused (the unit is then prepared
again) unless every column has a plain little-endian numeric or bool dtype from a fixed
list — never an object dtype, whose "values" would be raw bytes read as pointers — lies
inside the file and matches the header's own SHA-256; and each column's bytes are hashed
as they are read and compared with the SHA-256 written for them (`Tampered` on a
mismatch) — the first time a process reads the file, and again whenever the file it opens
is not that one unchanged (`FileId`: device, inode, size, modification and change times;
a write in place moves the change time, which no file owner can set back). Hashing every
read cost the loading threads more CPU than reading (issue 39). The checksums catch a
changed, truncated or corrupted file; someone who can
write the cache can also forge matching checksums, but never make the loader run code or
read out of bounds — only give it wrong numbers, as they could by editing the data.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("reagent_lite")

FORMAT = 2  # 2: checksums, the dtype list
MAGIC = b"RLPREP\x00\x02"
ALIGN = 64  # each array starts at a multiple of this (cache lines; any dtype's alignment)
_LEAD = len(MAGIC) + 8
# The only dtypes a prepared column may have (numpy's `dtype.str`).
DTYPES = frozenset(
    np.dtype(t).str for t in ("?", "i1", "u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8")
) | frozenset(np.dtype(t).str for t in ("<f2", "<f4", "<f8"))


class Tampered(OSError):
    """A prepared file's bytes are not the ones written (changed after the header was
    checked): the unit is prepared again."""


def _header_sha(key: str, columns: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps([key, columns], sort_keys=True).encode()).hexdigest()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write_arrays(path: Path, key: str, arrays: Mapping[str, np.ndarray]) -> None:
    """`arrays` (equal leading length) into `path`, atomically: magic, header length
    (uint64 LE), JSON header (space-padded so that the arrays start `ALIGN`ed), then each
    array C-ordered little-endian at an `ALIGN`ed offset from there."""
    columns: list[dict[str, Any]] = []
    little: list[np.ndarray] = []
    offset = 0
    for name, a in arrays.items():
        offset = _aligned(offset)
        dtype = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dtype.str not in DTYPES:
            raise ValueError(f"{path}: column {name!r} has dtype {dtype}, not a plain number")
        little.append(np.ascontiguousarray(a, dtype=dtype))
        sha = hashlib.sha256(little[-1].data.cast("B")).hexdigest()
        columns.append(
            {"name": name, "dtype": dtype.str, "shape": list(a.shape), "at": offset, "sha": sha}
        )
        offset += a.nbytes
    header: dict[str, Any] = {"format": FORMAT, "key": key, "columns": columns}
    header["check"], header["bytes"] = _header_sha(key, columns), 0
    start = _aligned(_LEAD + len(json.dumps(header).encode()) + 24)  # room for the byte count
    header["bytes"] = start + offset
    head = json.dumps(header).encode().ljust(start - _LEAD)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(MAGIC + len(head).to_bytes(8, "little") + head)
            for col, a in zip(columns, little, strict=True):
                f.seek(start + col["at"])
                f.write(a.data)
            f.truncate(header["bytes"])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_header(path: Path, key: str) -> tuple[list[dict[str, Any]], int] | None:
    """The columns of the file `write_arrays` wrote into `path` under `key` (name, dtype,
    shape, offset, checksum) and where its arrays start; None when the file is missing,
    and None with a warning naming it when it is of another key or format, not whole, or
    its header is not one `write_arrays` writes (see the module notes)."""
    try:
        with path.open("rb") as f:
            lead = f.read(_LEAD)
            size = os.fstat(f.fileno()).st_size
            length = int.from_bytes(lead[len(MAGIC) :], "little")
            ok = len(lead) == _LEAD and lead[: len(MAGIC)] == MAGIC and length <= size
            head = json.loads(f.read(length)) if ok else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("stream_prepare: %s is unreadable (%s); preparing it again", path, e)
        return None
    problem = _header_problem(head, key, size, _LEAD + length)
    if problem:
        log.warning("stream_prepare: refused %s (%s); preparing it again", path, problem)
        return None
    assert isinstance(head, dict)
    return head["columns"], _LEAD + length


def _header_problem(head: object, key: str, size: int, start: int) -> str | None:
    """What is wrong with a header read from a file of `size` bytes; None: nothing."""
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        return f"not a prepared unit of format {FORMAT}"
    if head.get("key") != key:
        return "prepared from other data"
    if head.get("bytes") != size:
        return f"{size} bytes, the header says {head.get('bytes')}"
    columns = head.get("columns")
    if not isinstance(columns, list) or not columns:
        return "no columns"
    rows = set()
    for col in columns:
        fields = ("name", "dtype", "shape", "at", "sha")
        if not isinstance(col, dict) or set(col) != set(fields):
            return f"a column entry is not {{{', '.join(fields)}}}: {str(col)[:80]}"
        if col["dtype"] not in DTYPES:
            return f"column {col['name']!r} has dtype {col['dtype']!r}, not a plain number"
        shape, at = col["shape"], col["at"]
        if not (isinstance(shape, list) and shape and all(_count(n) for n in shape)):
            return f"column {col['name']!r} has shape {shape!r}"
        nbytes = np.dtype(col["dtype"]).itemsize * int(np.prod(shape))
        if not (_count(at) and start + at + nbytes <= size):
            return f"column {col['name']!r} lies outside the file"
        rows.add(shape[0])
    if len(rows) != 1:
        return f"columns of different lengths {sorted(rows)}"
    if head.get("check") != _header_sha(key, columns):
        return "the header's checksum does not match"
    return None


def _count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 48


def _check(path: Path, col: dict[str, Any], data: memoryview) -> None:
    if hashlib.sha256(data).hexdigest() != col["sha"]:
        raise Tampered(f"{path}: column {col['name']!r} is not what was written (checksum)")


def read_arrays(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The arrays of `path` (see `read_header`), memory-mapped read-only and checked
    against their checksums; None as there, or when a checksum does not match."""
    found = read_header(path, key)
    if found is None:
        return None
    columns, start = found
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for col in columns:
        dtype, shape = np.dtype(col["dtype"]), tuple(col["shape"])
        at = start + col["at"]
        flat = whole[at : at + dtype.itemsize * int(np.prod(shape))]
        try:
            _check(path, col, flat.data)
        except Tampered as e:
            log.warning("stream_prepare: %s", e)
            return None
        out[col["name"]] = flat.view(dtype).reshape(shape)
    return out


# (device, inode, size, modification time, change time; times in ns) of an open file: one
# replaced, rewritten, cut or written in place differs.
FileId = tuple[int, int, int, int, int]


def _read_at_once(
    fd: int, columns: list[dict[str, Any]], start: int, out: Mapping[str, np.ndarray]
) -> bool:
    """All the columns into `out` in one `preadv` (the gaps between them into scratch):
    one system call, and one wait for the interpreter lock, per unit instead of two per
    column — a GPU run's loads share the interpreter with the thread that drives the step
    (issue 39). False, with `out` to be read column by column, where one call cannot do it
    (columns out of order or overlapping, too many, a short read)."""
    spans = sorted(
        ((start + c["at"], out[c["name"]].data.cast("B")) for c in columns), key=lambda s: s[0]
    )
    first = pos = spans[0][0] if spans else 0
    buffers: list[memoryview | bytearray] = []
    for at, dest in spans:
        if at < pos:
            return False
        if at > pos:
            buffers.append(bytearray(at - pos))
        buffers.append(dest)
        pos = at + dest.nbytes
    if not buffers or len(buffers) > 512 or not hasattr(os, "preadv"):
        return False
    return os.preadv(fd, buffers, first) == pos - first


def file_id(st: os.stat_result) -> FileId:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_into(
    path: Path,
    columns: list[dict[str, Any]],
    start: int,
    out: Mapping[str, np.ndarray],
    verified: FileId | None = None,
) -> tuple[FileId | None, bool]:
    """The arrays of `path` (`read_header`'s `columns` and `start`) copied into `out`
    (C-contiguous, of their dtypes and shapes): one read per column straight from the
    page cache, no mapping to fault in. The bytes are hashed as they are read (`Tampered`
    when they are not the ones written, so a file changed after its header was read is
    caught too) unless the file opened is `verified`: the identity of one whose bytes were
    read and checked before, unchanged since. Returns the identity to pass next time (None
    when the file changed while being read) and whether the bytes were hashed."""
    with path.open("rb", buffering=0) as f:
        opened = file_id(os.fstat(f.fileno()))
        check = verified is None or opened != verified
        whole = _read_at_once(f.fileno(), columns, start, out)
        for col in columns:
            dest = out[col["name"]].data.cast("B")
            if not whole:
                f.seek(start + col["at"])
                if f.readinto(dest) != dest.nbytes:
                    raise Tampered(f"{path}: a prepared unit was cut short while being read")
            if check:
                _check(path, col, dest)
        if check and file_id(os.fstat(f.fileno())) != opened:
            return None, check
    return opened, check
