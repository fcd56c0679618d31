"""`benchmarks.step_ops`: operator calls land in the step part they belong to, on either
library's path, and the command runs end to end on a CPU (tiny: the command, not speed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.step_ops import PARTS, part_of
from tests.conftest import run_module

B, H = 1024, 256


@pytest.mark.parametrize(
    ("op", "shapes", "part"),
    [
        # oneDNN path (AMD): forward x·Wᵀ + b, input gradient g·W (weight passed as Wᵀ)
        ("mkldnn._linear_pointwise.default", ((B, H), (H, H), (H,)), PARTS[0]),
        ("mkldnn._linear_pointwise.default", ((B, H), (H, H)), PARTS[2]),
        # MKL path (Intel): the same three products
        ("aten.addmm.default", ((H,), (B, H), (H, H)), PARTS[0]),
        ("aten.mm.default", ((H, B), (B, H)), PARTS[1]),
        ("aten.mm.default", ((B, H), (H, H)), PARTS[2]),
        # the 4-feature first layer and the 2-action last layer, and their gradients
        ("aten.addmm.default", ((H,), (B, 4), (4, H)), PARTS[3]),
        ("aten.addmm.default", ((2,), (B, H), (H, 2)), PARTS[3]),
        ("aten.mm.default", ((4, B), (B, H)), PARTS[4]),
        ("aten.mm.default", ((B, 2), (2, H)), PARTS[4]),
        ("aten.relu_.default", ((B, H),), PARTS[5]),
        ("aten.threshold_backward.grad_input", ((B, H), (B, H)), PARTS[5]),
        ("aten.sum.dim_IntList", ((B, H),), PARTS[5]),
        ("aten.sum.dim_IntList", ((B, 2),), PARTS[7]),
        ("aten._fused_adam_.default", (), PARTS[6]),
        ("aten.index_select.default", ((110_000, 15), (B,)), PARTS[6]),
        ("aten.argmax.default", ((B, 2),), PARTS[7]),
    ],
)
def test_operator_calls_are_grouped_by_step_part(
    op: str, shapes: tuple[tuple[int, ...], ...], part: str
) -> None:
    assert part_of(op, shapes) == part


def test_step_ops_prints_every_part_and_their_total(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")  # the benchmark's sample data comes from CartPole
    proc = run_module(
        "benchmarks.step_ops",
        *("--batch", "128", "--steps", "3", "--runs", "1", "--data-dir", str(tmp_path)),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = {
        name: float(m.group(1))
        for name in PARTS
        if (m := re.search(rf"^  {re.escape(name)}\s+(\d+)$", proc.stdout, re.M))
    }
    assert set(figures) == set(PARTS), proc.stdout
    total = re.search(r"all operators \((\d+) calls a step\)\s+(\d+)", proc.stdout)
    assert total, proc.stdout
    assert int(total.group(1)) > 20  # a real step: dozens of operator calls
    # The total is the parts' sum (each printed rounded to 1 µs).
    assert abs(float(total.group(2)) - sum(figures.values())) <= len(PARTS)
    assert figures[PARTS[0]] > 0 and figures[PARTS[1]] > 0  # the products were seen
