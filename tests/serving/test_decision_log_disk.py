"""A full disk, for real: a 256 KiB tmpfs (in a private mount namespace) fills up under the
decision log. `record` then refuses with the directory and the errno, every part written
stays complete, no temp file is left, and once space is freed the held rows are written and
decisions are taken again, none lost or doubled."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.training.runs import run_in_mount_namespace

_FILL = """
import json, subprocess, sys, time
from pathlib import Path
import pyarrow.parquet as pq
from reagent_lite.serving.decision_log import DecisionLog, DecisionRecord, LogUnavailable

root = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "none", str(root)], check=True)
(root / "filler").write_bytes(b"x" * 64 * 1024)
log_dir = root / "log"
# A window of 0: every decision is written at the next flush, so the disk fills quickly.
log = DecisionLog(log_dir, "dqn", flush_interval_s=0.02, feedback_window_s=0.0)
accepted, message = [], ""

def rec(i):
    return DecisionRecord(f"d{i}", f"ep{i}", 0, {k: k + i / 7 for k in range(64)}, "a",
                          ["a", "b"], 0.5, "m" * 64, time.time())

deadline = time.monotonic() + 90
while time.monotonic() < deadline and not message:
    try:
        log.record(rec(len(accepted)))
        accepted.append(f"d{len(accepted)}")
    except LogUnavailable as err:
        message = str(err)
    time.sleep(0.002)
readable = sum(pq.read_table(p).num_rows for p in log_dir.glob("part-*"))
leftovers = sorted(str(p.relative_to(log_dir)) for p in log_dir.rglob(".*.tmp*"))
try:
    log.record(rec(len(accepted)))
    accepted.append(f"d{len(accepted)}")
    refused_again = False
except LogUnavailable:
    refused_again = True
(root / "filler").unlink()  # space again: the flusher's next try writes the held rows
taken_again = False
while time.monotonic() < deadline and not taken_again:
    try:
        log.record(rec(len(accepted)))
        accepted.append(f"d{len(accepted)}")
        taken_again = True
    except LogUnavailable:
        time.sleep(0.05)
log.close()
ids = pq.read_table(log_dir).column("decision_id").to_pylist()
print(json.dumps({"message": message, "readable_while_full": readable, "leftovers": leftovers,
                  "refused_again": refused_again, "taken_again": taken_again,
                  "accepted": accepted, "written": ids, "log_dir": str(log_dir)}))
"""


def test_a_full_disk_refuses_decisions_and_keeps_every_part(tmp_path: Path) -> None:
    (tmp_path / "fs").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = run_in_mount_namespace(_FILL, tmp_path / "fs", env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["message"].startswith(f"decision log {out['log_dir']}: cannot write '")
    assert "No space left on device (ENOSPC)" in out["message"]
    assert out["readable_while_full"] > 0 and out["leftovers"] == []
    assert out["refused_again"] and out["taken_again"]
    assert sorted(out["written"]) == sorted(out["accepted"])  # none lost, none twice
