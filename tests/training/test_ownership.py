"""One run owns its output directory: the lock, run ids, --resume's config check, the
fallback past an unreadable checkpoint, and model files that appear together."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reagent_lite import export
from reagent_lite.errors import ConfigError, TrainingError
from reagent_lite.io_utils import OWNED_ENV, OwnershipLost, atomic_write_json
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.ownership import OutputLock, current_run_id
from tests.conftest import REPO_ROOT, run_module
from tests.training.runs import run_in_mount_namespace
from tests.training.runs import run_workflow as _run
from tests.training.runs import tiny_dqn_config as _config
from tests.workflows.test_end_to_end import make_config


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.iterdir()
        if p.is_file()
    }


def test_a_second_run_on_a_locked_directory_exits_2_naming_the_holder(tmp_path: Path) -> None:
    config = make_config(tmp_path, "dqn", epochs=1)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".model.pt2.abc.tmp.pt2").write_text("left by a killed write")
    with OutputLock(out):
        assert not (out / ".model.pt2.abc.tmp.pt2").exists(), "temp file not cleaned"
        second = run_module("workflows.dqn_workflow", "--config", str(config), timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    assert "is in use by another run" in second.stderr and f"pid {os.getpid()}" in second.stderr
    assert "Traceback" not in second.stderr


def test_a_stale_lock_is_taken_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    lock = OutputLock(tmp_path)
    lock.path.write_text(json.dumps({"host": lock.host, "pid": int(dead.stdout), "start": "1"}))
    with caplog.at_level(logging.WARNING, logger="reagent_lite"), OutputLock(tmp_path):
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert "taking over the lock" in caplog.text
    assert not lock.path.exists(), "released on exit"
    # Another host's lock whose heartbeat stopped long ago.
    lock.path.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    os.utime(lock.path, (0, 0))
    with OutputLock(tmp_path):
        pass
    # ... and a live one of another host is respected.
    lock.path.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    with pytest.raises(ConfigError, match="host elsewhere pid 1"):
        OutputLock(tmp_path).acquire()


def test_a_fresh_run_never_touches_an_older_runs_checkpoints(tmp_path: Path) -> None:
    old = _run(_config(tmp_path, epochs=3))
    old_dir = ckpt.checkpoint_dir(tmp_path / "out", old.run_id)
    before = _digests(old_dir)
    new = _run(_config(tmp_path, epochs=1))
    assert new.run_id != old.run_id and current_run_id(tmp_path / "out") == new.run_id
    assert _digests(old_dir) == before, "the older run's checkpoints changed"
    # --resume continues the newest run, not the older one with more epochs.
    resumed = _run(_config(tmp_path, epochs=2), resume=True)
    assert resumed.run_id == new.run_id and resumed.start_epoch == 1


def test_resume_refuses_a_config_that_changes_the_maths(tmp_path: Path) -> None:
    _run(_config(tmp_path, epochs=1))
    changed = _config(tmp_path, epochs=2, training={"learning_rate": 0.01}, rl={"gamma": 0.5})
    with pytest.raises(ConfigError) as err:
        _run(changed, resume=True)
    message = str(err.value)
    assert (
        "training.learning_rate (0.001 -> 0.01)" in message and "rl.gamma (0.99 -> 0.5)" in message
    )
    # The allow-list may change.
    wf = _run(
        _config(tmp_path, epochs=2, log_every_steps=3, checkpoint_every_epochs=2), resume=True
    )
    assert wf.start_epoch == 1


def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _run(_config(tmp_path, epochs=2))
    newest = ckpt.latest_checkpoint(tmp_path / "out")
    assert newest is not None and newest.name == "epoch_00001.pt"
    newest.write_bytes(newest.read_bytes()[:500])
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        wf = _run(_config(tmp_path, epochs=2), resume=True)
    assert wf.start_epoch == 1, "did not resume from epoch 0's checkpoint"
    assert f"skipping {newest}" in caplog.text


def test_model_files_of_a_run_appear_together_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wf = _run(_config(tmp_path, epochs=1), save=True)
    out = tmp_path / "out"
    meta = json.loads((out / "model_meta.json").read_text())
    assert meta["run_id"] == wf.run_id

    # The next run dies while writing model.pt2: the old meta must not describe the files.
    def broken(program: Any, path: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.torch.export, "save", broken)
    with pytest.raises(OSError):
        export.write_outputs(wf.result())
    assert not (out / "model_meta.json").exists()


def test_a_full_disk_mid_run_is_one_error_and_keeps_the_last_checkpoint_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(_config(tmp_path, epochs=1), save=True)
    out = tmp_path / "out"
    good = ckpt.latest_checkpoint(out)
    assert good is not None
    before = _digests(out) | _digests(good.parent)
    real_fsync = os.fsync

    def full(fd: int) -> None:  # NFS reports a full disk at fsync; so do we, here
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp.pt"):
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(TrainingError) as err:
        _run(_config(tmp_path, epochs=2), resume=True)
    message = str(err.value)
    assert "epoch_00001.pt'" in message and "ENOSPC" in message and str(good) in message
    assert "\n" not in message
    monkeypatch.setattr(os, "fsync", real_fsync)
    after = _digests(out) | _digests(good.parent)
    for name in ("model.pt2", "model_meta.json", "model_state.pt", good.name):
        assert after[name] == before[name], name
    assert not [p for p in good.parent.iterdir() if ".tmp" in p.name], "temp file left"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != OWNED_ENV}
    return {**env, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


# One contender of the race: for each trial, waits for its start signal, then tries to
# take the directory's stale lock and reports "own" or "refused" (owners keep the lock).
_CONTENDER = """
import sys, time
from pathlib import Path
from reagent_lite.errors import ConfigError
from reagent_lite.training.ownership import OutputLock

base, trials, me = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
held = []
for i in range(trials):
    while not (base / f"go{i}").exists():
        time.sleep(0.0005)
    lock = OutputLock(base / f"t{i}")
    try:
        lock.acquire()
        held.append(lock)
        result = "own"
    except ConfigError:
        result = "refused"
    (base / f".r{i}.{me}").write_text(result)
    (base / f".r{i}.{me}").rename(base / f"r{i}.{me}")  # whole when the driver sees it
"""


def test_contenders_for_one_stale_lock_end_with_exactly_one_owner(tmp_path: Path) -> None:
    trials, n = 30, 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, str(tmp_path), str(trials), str(k)],
            cwd=REPO_ROOT,
            env=_env(),
            stderr=subprocess.DEVNULL,
        )
        for k in range(n)
    ]
    try:
        owners = []
        for i in range(trials):
            d = tmp_path / f"t{i}"
            d.mkdir()
            (d / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
            os.utime(d / ".lock", (0, 0))  # its heartbeat stopped long ago
            (tmp_path / f"go{i}").touch()
            deadline = time.monotonic() + 60
            while len(results := sorted(tmp_path.glob(f"r{i}.*"))) < n:
                assert time.monotonic() < deadline, f"trial {i}: no answer from every contender"
                assert all(p.poll() is None for p in procs), "a contender died"
                time.sleep(0.01)
            owners.append([r.read_text() for r in results].count("own"))
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    assert owners == [1] * trials, owners


# A run holding its directory: writes a metric and a file, waits for `go`, then writes
# again, as a run does after a pause; stops with the error when it lost the directory.
_PAUSED = """
import sys, time
from pathlib import Path
from reagent_lite.io_utils import OwnershipLost, atomic_write_json
from reagent_lite.training.metrics import MetricsWriter
from reagent_lite.training.ownership import OutputLock

out, go = Path(sys.argv[1]), Path(sys.argv[2])
with OutputLock(out):
    metrics = MetricsWriter(out)
    metrics.write({"who": "A", "step": 1})
    atomic_write_json(out / "run.json", {"who": "A"})
    print("owned", flush=True)
    while not go.exists():
        time.sleep(0.05)
    try:
        metrics.write({"who": "A", "step": 2})
        atomic_write_json(out / "run.json", {"who": "A", "again": True})
    except OwnershipLost as e:
        print(e, flush=True)
        sys.exit(e.exit_code)
"""


def test_an_owner_paused_and_taken_over_stops_and_writes_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out, go = tmp_path / "out", tmp_path / "go"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, str(out), str(go)],
        cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "owned"
        proc.send_signal(signal.SIGSTOP)  # Ctrl-Z, scontrol suspend, a VM pause
        time.sleep(1.5)
        with caplog.at_level(logging.WARNING, logger="reagent_lite"):
            other = OutputLock(out, stale_after_s=1.0)
            other.acquire()
        assert "taking over the lock" in caplog.text
        atomic_write_json(out / "run.json", {"who": "B"})
        go.touch()
        proc.send_signal(signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 5, stderr[-2000:]
    assert "no longer owns" in stdout and "Traceback" not in stderr
    assert json.loads((out / "run.json").read_text()) == {"who": "B"}
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock",
        ".lock.guard",
        "metrics.jsonl",
        "run.json",
    ]
    assert other.still_own(), "the paused run's release left the new owner's lock alone"
    other.release()
    assert not (out / ".lock").exists()


# In a mount namespace of its own: the output directory on a tmpfs that turns read-only
# while the run holds it, and the run stopping with its error.
_READ_ONLY = """
import logging, subprocess, sys
from pathlib import Path
from reagent_lite.errors import TrainingError
from reagent_lite.training.ownership import OutputLock

logging.basicConfig(level=logging.WARNING)
out = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "none", str(out)], check=True)
try:
    with OutputLock(out):
        subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
        raise TrainingError("cannot write (EROFS); stopping")
except TrainingError as e:
    print("raised:", e, flush=True)
"""


def test_a_lock_release_failing_on_a_read_only_filesystem_never_masks_the_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").mkdir()
    done = run_in_mount_namespace(_READ_ONLY, tmp_path / "out", _env(), timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "raised: cannot write (EROFS); stopping" in done.stdout
    assert "could not remove the lock" in done.stderr and "Read-only file system" in done.stderr


def test_a_run_taken_over_before_its_export_leaves_the_other_runs_model_alone(
    tmp_path: Path,
) -> None:
    wf = _run(_config(tmp_path, epochs=1), save=True)
    out = tmp_path / "out"
    before = {k: v for k, v in _digests(out).items() if not k.startswith(".")}
    assert "model_meta.json" in before
    take_over = "import sys; from pathlib import Path; from reagent_lite.training.ownership "
    take_over += "import OutputLock; OutputLock(Path(sys.argv[1]), stale_after_s=0).acquire()"
    with OutputLock(out):
        # Another run takes the directory over (as after this one was paused) and keeps it.
        subprocess.run([sys.executable, "-c", take_over, str(out)], cwd=REPO_ROOT, env=_env(),
                       check=True, timeout=120)  # fmt: skip
        with pytest.raises(OwnershipLost, match="no longer owns"):
            export.write_outputs(wf.result())
    assert {k: v for k, v in _digests(out).items() if not k.startswith(".")} == before
