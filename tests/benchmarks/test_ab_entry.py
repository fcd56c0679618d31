"""ab_entry's reading of a run: a run refused export for divergence still measured its steps."""

from __future__ import annotations

import json

from benchmarks.ab_entry import measured


def _metrics(rates: list[float]) -> str:
    lines = [json.dumps({"epoch": i + 1, "transitions_per_s": r}) for i, r in enumerate(rates)]
    return "\n".join([json.dumps({"run": "start"}), *lines, ""])


def test_a_clean_run_gives_the_median_of_the_epochs_after_the_first() -> None:
    log = "x training step: one CUDA graph per step, fp32\n"
    res = measured(0, log, _metrics([1.0, 4.0, 6.0]), 3)
    assert res == {
        "median": 5.0,
        "epochs": [1.0, 4.0, 6.0],
        "step": "one CUDA graph per step, fp32",
    }


def test_a_run_refused_export_for_divergence_after_every_epoch_is_measured_with_a_note() -> None:
    log = "training step: eager, fp32\nthe Q-network diverged: from epoch 3 on ...\n"
    res = measured(5, log, _metrics([1.0, 4.0, 6.0]), 3)
    assert res["median"] == 5.0
    assert "export refused: the Q-network diverged" in str(res["step"])


def test_other_failures_stay_errors() -> None:
    full = _metrics([1.0, 4.0, 6.0])
    # exit 5 for another reason, a divergence before the last epoch, any other exit code
    assert "error" in measured(5, "shard has no rows", full, 3)
    assert "error" in measured(5, "the Q-network diverged", _metrics([1.0, 4.0]), 3)
    assert "error" in measured(1, "the Q-network diverged", full, 3)


def test_both_orders_compares_each_tree_s_mean_over_its_two_places() -> None:
    from benchmarks.ab_entry import both_orders_summary

    # after ran second (x1.2 from its place) then first; before the other way round
    lines = both_orders_summary(
        "c", ["before", "after"], {"before": [10.0, 12.0], "after": [12.0, 10.0]}
    )
    assert lines[1].endswith("both orders: x1.000")
    lines = both_orders_summary(
        "c", ["before", "after"], {"before": [10.0, 10.0], "after": [11.0, 11.0]}
    )
    assert lines[1].endswith("both orders: x1.100")
    one = both_orders_summary("c", ["before", "after"], {"before": [10.0, 10.0], "after": [11.0]})
    assert one[1].endswith("(one place only: not comparable)")
    assert not one[0].endswith("not comparable)")  # the baseline ran in both places
