"""Atomic writes: never a half-written file, modes that honour the umask, early checks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import atomic_write, atomic_write_json, ensure_writable_dir


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "model.pt2"
    target.write_text("old")

    def half_then_crash(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(target, half_then_crash)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt2"]


def test_written_files_honour_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "meta.json", {"b": 1, "a": 2})
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "meta.json").stat().st_mode)
    assert mode == 0o644  # readable by the other nodes of a shared filesystem
    assert (tmp_path / "meta.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_unwritable_directory_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="model_output_path: cannot write"):
        ensure_writable_dir(blocker / "out", "model_output_path")
