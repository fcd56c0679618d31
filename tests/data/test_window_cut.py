"""A loaded disk window cut into chunks of whole steps (`data/window_cut.py`): rows short of
a step carried into the next window as a copy, chunks at most `chunk_rows`, no more rows
than the epoch still needs."""

from __future__ import annotations

import torch

from reagent_lite.data.window_cut import Left, Window


def _window(lo: int, hi: int) -> Window:
    return Window({"r": torch.arange(lo, hi), "s": torch.arange(lo, hi).view(-1, 1) * 2})


def test_rows_carried_across_windows_make_whole_steps_in_order() -> None:
    left = Left(rows=7 * 4)  # 7 steps of 4 rows, chunks of at most 2 steps
    chunks = [c for lo, hi in [(0, 7), (7, 13), (13, 30)] for c in _window(lo, hi).cut(left, 4, 8)]
    # 0-7: a step, 3 carried; 7-13: the carry's step, a step, 1 carried; 13-30: the carry's
    # step, a chunk of 2 steps, the epoch's last step (the window's last 2 rows unused).
    assert [n for _, n in chunks] == [4, 4, 4, 4, 8, 4]
    assert torch.equal(torch.cat([c["r"] for c, _ in chunks]), torch.arange(28))
    assert torch.equal(torch.cat([c["s"] for c, _ in chunks]).view(-1), torch.arange(28) * 2)
    assert left.rows == 0 and left.carry is None  # the epoch's rows, no more


def test_a_carry_is_a_copy_and_chunks_are_views() -> None:
    win = _window(0, 10)
    left = Left(rows=100)
    (chunk, n), *_ = list(win.cut(left, 4, 8))
    assert n == 8 and chunk["r"].data_ptr() == win.columns["r"].data_ptr()  # a view
    assert left.carried == 2 and torch.equal(left.carry["r"], torch.tensor([8, 9]))
    assert left.carry["r"].untyped_storage().nbytes() == 2 * 8  # not the whole window
