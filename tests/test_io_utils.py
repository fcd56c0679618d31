"""Atomic writes: never a half-written file, modes that honour the umask, early checks."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import reagent_lite
from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import atomic_write, atomic_write_json, ensure_writable_dir
from tests.conftest import run_module
from tests.test_api import tiny_config


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


def test_a_300_character_data_path_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    cfg["training_data_path"] = str(tmp_path / ("t" * 300 + ".parquet"))
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    for extra in ([], ["--dry_run"]):
        done = run_module("reagent_lite.console", "dqn", "--config", str(tmp_path / "c.json"),
                          *extra, timeout=120)  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert "training_data_path: '" in done.stderr
        assert "holds a name of 308 bytes" in done.stderr and "at most 255 bytes" in done.stderr


@pytest.mark.parametrize(
    ("key", "where"),
    [
        ("model_output_path", ("model_output_path",)),
        ("eval_data_path", ("eval_data_path",)),
        ("stream_prepared_dir", ("stream_prepared_dir",)),
        ("training.warm_start_model_path", ("training", "warm_start_model_path")),
    ],
)
def test_every_path_key_too_long_is_a_config_error_naming_it(
    tmp_path: Path, key: str, where: tuple[str, ...]
) -> None:
    cfg = tiny_config(tmp_path)
    block = cfg
    for part in where[:-1]:
        block = block.setdefault(part, {})
    block[where[-1]] = str(tmp_path / ("x" * 300))
    with pytest.raises(ConfigError, match=rf"^{key}: '.*holds a name of 300 bytes"):
        reagent_lite.train(cfg)
    # ... and a path of short names as long as PATH_MAX (4096 with its NUL: one too many).
    long = str(tmp_path / "/".join(["d" * 200] * 20))
    block[where[-1]] = long + "/" + "e" * (4096 - len(long) - 1)
    with pytest.raises(ConfigError, match=rf"^{key}: '.*expected a path shorter than 4096"):
        reagent_lite.train(cfg)
