"""benchmarks/serve_latency.py runs end to end (`--quick`: a tiny model trained on the
spot, real servers, 1 and 4 clients) and prints its table; no timing is asserted."""

from __future__ import annotations

from tests.conftest import run_module


def test_quick_run_prints_the_table() -> None:
    result = run_module("benchmarks.serve_latency", "--quick", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for mode in ("in-process model.pt2", "http serve", "http, unbatched"):
        assert mode in out, out
    rows = [line.split() for line in out.splitlines() if line.startswith("http serve")]
    assert [int(r[2]) for r in rows] == [1, 4]  # clients
    assert all(int(r[3]) == 40 for r in rows), out  # every request answered
    assert "batching at 4 clients:" in out
