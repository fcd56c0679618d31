"""The served model end to end: one exported program for every candidate count and batch
size (model.pt2, `load_model(...).score`, the `predict` command), model_meta.json verified
against model.pt2 before scoring, and `predict` streaming its output batch by batch.

One tiny real parametric run and one real dqn run per module: the files these tests read
are the files a run exports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reagent_lite
from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import file_sha256
from reagent_lite.predict import Predictor
from tests.conftest import run_module
from tests.test_api import tiny_config

FMAP = pa.map_(pa.string(), pa.float64())
CANDS = pa.list_(FMAP)


def _train(cfg: dict[str, Any]) -> Path:
    result = reagent_lite.train(cfg)
    return result.model_dir


@pytest.fixture(scope="module")
def parametric_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("parametric")
    return _train(
        {
            "workflow": "parametric_dqn",
            "training_data_path": str(tmp / "data/train.parquet"),
            "model_output_path": str(tmp / "model"),
            "use_gpu": False,
            "epochs": 1,
            "sample_data": {"kind": "synthetic_parametric", "episodes": 40, "seed": 0},
            "training": {"layers": [-1, 8, -1], "activations": ["relu", "linear"],
                         "minibatch_size": 32, "steps_per_epoch": 3},
            "evaluation": {"calc_cpe_in_training": False},
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def dqn_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("dqn")
    cfg = tiny_config(tmp)
    cfg.update(epochs=1, eval_data_path=None)
    cfg["training"] = {**cfg["training"], "steps_per_epoch": 3}
    cfg["evaluation"] = {"calc_cpe_in_training": False, "online_episodes": 0}
    return _train(cfg)


def _meta(model_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((model_dir / "model_meta.json").read_text())
    return meta


def _candidate_table(model_dir: Path, counts: list[int], seed: int = 0) -> pa.Table:
    """Rows in the training table's layout whose candidate lists have `counts` entries."""
    meta = _meta(model_dir)
    rng = np.random.default_rng(seed)
    state = [{f: float(rng.normal()) for f in meta["state_feature_ids"]} for _ in counts]
    cands = [
        [{f: float(rng.normal()) for f in meta["action_feature_ids"]} for _ in range(k)]
        for k in counts
    ]
    return pa.table(
        {"state_features": pa.array(state, FMAP), "possible_actions": pa.array(cands, CANDS)}
    )


# ---------------------------------------------------------------- one program, any K


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("k", [1, 2, 300])
def test_model_pt2_scores_any_candidate_count(parametric_dir: Path, batch: int, k: int) -> None:
    """One exported program serves every candidate count from 1 and every batch size from
    1; a set's scores are those of its candidates scored one at a time (K = 1)."""
    program = torch.export.load(str(parametric_dir / "model.pt2")).module()
    meta = _meta(parametric_dir)
    f, g = len(meta["state_feature_ids"]), len(meta["action_feature_ids"])
    gen = torch.Generator().manual_seed(k)
    state, actions = torch.randn(batch, f, generator=gen), torch.randn(batch, k, g, generator=gen)
    ones = torch.ones(batch, k, g)
    q = program(state, torch.ones(batch, f), actions, ones, torch.ones(batch, k))
    assert q.shape == (batch, k) and torch.isfinite(q).all()
    for j in (0, k - 1):
        one = program(state, torch.ones(batch, f), actions[:, j : j + 1], ones[:, :1],
                      torch.ones(batch, 1))  # fmt: skip
        torch.testing.assert_close(one[:, 0], q[:, j], rtol=1e-5, atol=1e-5)


def test_load_model_scores_rows_of_one_candidate(parametric_dir: Path) -> None:
    model = reagent_lite.load_model(parametric_dir)
    for counts in ([1], [1, 1, 1], [1, 2, 300], [2, 2]):
        scored = model.score(_candidate_table(parametric_dir, counts))
        assert [len(s) for s in scored.column("candidate_scores").to_pylist()] == counts
        assert [r[0] for r in scored.column("ranked_candidates").to_pylist()] == \
            scored.column("best_candidate").to_pylist()  # fmt: skip
    # Batches of one row, each its own K, score as the whole table does.
    table = _candidate_table(parametric_dir, [1, 3, 1, 2])
    whole = model.score(table).column("candidate_scores").to_pylist()
    rows = model.score(table, batch_size=1).column("candidate_scores").to_pylist()
    np.testing.assert_allclose(np.concatenate(rows), np.concatenate(whole), rtol=1e-6)


@pytest.mark.parametrize("counts", [[1], [1, 1, 1, 1, 1]])
def test_predict_cli_scores_rows_of_one_candidate(
    parametric_dir: Path, tmp_path: Path, counts: list[int]
) -> None:
    data = tmp_path / "one.parquet"
    pq.write_table(_candidate_table(parametric_dir, counts), data)
    out = tmp_path / "scores.jsonl"
    result = run_module("reagent_lite.predict", "--model", str(parametric_dir), "--data",
                        str(data), "--output", str(out), timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["best_candidate"] for r in rows] == [0] * len(counts)
    assert all(len(r["candidate_scores"]) == 1 for r in rows)


def test_dqn_model_of_one_action_and_rows_of_one_possible_action(
    dqn_dir: Path, tmp_path: Path
) -> None:
    """The dqn kind at its own "one": a program exported for a single action, batch 1 and
    more, through torch.export.save / load; rows whose `possible_actions` hold one action."""
    from reagent_lite.config import DQNWorkflowConfig
    from reagent_lite.export import export_program
    from reagent_lite.kinds import DiscreteSpace, get_kind
    from reagent_lite.normalization.identify import fit_normalization
    from reagent_lite.normalization.module import Preprocessor

    kind, ids = get_kind("dqn"), ["0", "1", "2"]
    space = DiscreteSpace(state_ids=ids, actions=["only"])
    pre = Preprocessor(ids, fit_normalization(np.random.default_rng(0).normal(size=(50, 3)), ids))
    cfg = DQNWorkflowConfig(training_data_path="t", model_output_path="o", actions=["only"])
    net = kind.build_q_network(cfg, {"state": 3}, space)
    with torch.no_grad():
        program = export_program(kind.serving_module({"state": pre}, net), kind, space)
    torch.export.save(program, tmp_path / "one.pt2")
    loaded = torch.export.load(str(tmp_path / "one.pt2")).module()
    for batch in (1, 3):
        assert loaded(torch.zeros(batch, 3), torch.ones(batch, 3)).shape == (batch, 1)

    model = reagent_lite.load_model(dqn_dir)
    state = pa.array([{fid: 0.5 for fid in model.state_feature_ids}] * 3, FMAP)
    for batch_size in (1, 3):
        table = pa.table(
            {"state_features": state, "possible_actions": pa.array([["1"], ["0"], []])}
        )
        scored = model.score(table, batch_size=batch_size)
        assert scored.column("best_action").to_pylist() == ["1", "0", None]


# ------------------------------------------------------ model_meta.json, verified


def _copy(model_dir: Path, dst: Path, **meta_changes: Any) -> Path:
    dst.mkdir()
    (dst / "model.pt2").write_bytes((model_dir / "model.pt2").read_bytes())
    meta = {**_meta(model_dir), **meta_changes}
    meta = {k: v for k, v in meta.items() if v is not None}
    (dst / "model_meta.json").write_text(json.dumps(meta))
    return dst


def test_meta_without_the_models_digest_is_refused(dqn_dir: Path, tmp_path: Path) -> None:
    """A model.pt2 of another run beside a meta with no digest would be scored with the
    meta's action names: refused, exit 2, one line."""
    foreign = _copy(dqn_dir, tmp_path / "foreign", model_sha256=None, actions=["1", "0"])
    data = tmp_path / "rows.parquet"
    pq.write_table(pq.read_table(dqn_dir.parent / "data/train.parquet").slice(0, 5), data)
    result = run_module("reagent_lite.predict", "--model", str(foreign), "--data", str(data),
                        "--output", str(tmp_path / "s.parquet"), timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "names no model_sha256" in result.stderr and "refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.parquet").exists()
    for bad in ("", "0" * 63, 17):
        with pytest.raises(ConfigError, match="names no model_sha256"):
            Predictor(_copy(dqn_dir, tmp_path / f"bad{bad!r}", model_sha256=bad))


@pytest.mark.parametrize(
    "change",
    ["one_state_feature_fewer", "one_action_feature_more", "one_action_more", "other_kind"],
)
def test_meta_that_does_not_describe_the_program_is_refused(
    parametric_dir: Path, dqn_dir: Path, tmp_path: Path, change: str
) -> None:
    """The meta carries the right digest (whoever replaced one file could rewrite the
    other) but not the program's inputs: refused before scoring, naming both files."""
    source = dqn_dir if change in ("one_action_more", "other_kind") else parametric_dir
    meta = _meta(source)
    # Each meta holds its own kind's fields only: built for the chosen change alone.
    changes: dict[str, Any] = {
        "one_state_feature_fewer": lambda: {"state_feature_ids": meta["state_feature_ids"][:-1]},
        "one_action_feature_more": lambda: {
            "action_feature_ids": [*meta["action_feature_ids"], "999"]
        },
        "one_action_more": lambda: {"actions": [*meta["actions"], "2"]},
        "other_kind": lambda: {
            "workflow": "parametric_dqn",
            "action_feature_ids": ["5"],
            "max_candidates": 2,
        },
    }[change]()
    copied = _copy(source, tmp_path / change, **changes)
    expected = {
        "one_state_feature_fewer": r"input 'state_values' has \d+ entries in dimension 1, but"
        r" .* implies \d+ \(state_feature_ids\)",
        "one_action_feature_more": r"input 'action_values' has \d+ entries in dimension 2.*"
        r"\(action_feature_ids\)",
        "one_action_more": r"scores 2 actions, but .* names 3 \(actions\)",
        "other_kind": r"takes inputs \['state_values', 'state_presence'\], not the "
        r"parametric_dqn model's",
    }[change]
    with pytest.raises(ConfigError, match=expected):
        Predictor(copied)


def test_predict_cli_meta_one_state_feature_fewer_exit_2(
    parametric_dir: Path, tmp_path: Path
) -> None:
    meta = _meta(parametric_dir)
    copied = _copy(parametric_dir, tmp_path / "m", state_feature_ids=meta["state_feature_ids"][:-1])
    data = tmp_path / "rows.parquet"
    pq.write_table(_candidate_table(parametric_dir, [2, 3]), data)
    result = run_module("reagent_lite.predict", "--model", str(copied), "--data", str(data),
                        "--output", str(tmp_path / "s.parquet"), timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "(state_feature_ids)" in result.stderr and "Traceback" not in result.stderr
    assert file_sha256(copied / "model.pt2") == meta["model_sha256"]


def test_preprocessor_normalizes_candidate_sets_as_rows() -> None:
    """The served parametric model normalizes candidates as [B, K, G], never merging B and
    K: every feature type gives the bits of the same candidates normalized as rows, and the
    module exports with both dimensions dynamic, K = 1 included."""
    from reagent_lite.normalization.module import Preprocessor
    from tests.normalization.test_module import _fitted

    ids, params, x = _fitted()  # binary, enum, Box-Cox, quantile ... with absent values
    pre = Preprocessor(ids, params).eval()
    values = torch.from_numpy(x[:24]).float().reshape(4, 6, len(ids))
    presence = (~torch.isnan(values)).float()
    sets = pre(values, presence)
    rows = pre(values.reshape(24, -1), presence.reshape(24, -1))
    assert sets.shape == (4, 6, pre.out_dim)
    assert torch.equal(sets.reshape(24, -1), rows)
    assert Preprocessor([], {})(torch.zeros(2, 3, 0), torch.zeros(2, 3, 0)).shape == (2, 3, 0)
    b, k = torch.export.Dim("b", min=1), torch.export.Dim("k", min=1)
    dims = {0: b, 1: k}
    program = torch.export.export(
        pre, (values, presence), dynamic_shapes={"values": dims, "presence": dims}
    ).module()
    for shape in ((1, 1), (3, 1), (1, 5)):
        v, p = values[: shape[0], : shape[1]], presence[: shape[0], : shape[1]]
        assert torch.equal(program(v, p), pre(v, p))


# ------------------------------------------------------------ predict streams


def _multi_group(src: Path, dst: Path, rows: int, group: int) -> pa.Table:
    table = pq.read_table(src).slice(0, rows)
    pq.write_table(table, dst, row_group_size=group)
    return table


def _predict(model: Path, data: Path, out: Path, *extra: str) -> None:
    # In process (the command's own `main`): the exit codes are the subprocess tests' part.
    from reagent_lite.predict import main

    main(["--model", str(model), "--data", str(data), "--output", str(out), *extra])


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_predict_writes_batch_by_batch_what_one_batch_writes(
    dqn_dir: Path, parametric_dir: Path, tmp_path: Path, kind: str
) -> None:
    """10 rows in row groups of 4, scored 3 rows at a time: the Parquet output holds one
    row group per batch as read ([3, 1], [3, 1], [2]): each batch was written as it was
    scored. Every format's output equals that of scoring the rows in one batch."""
    model = dqn_dir if kind == "dqn" else parametric_dir
    data = tmp_path / "in.parquet"
    _multi_group(model.parent / "data/train.parquet", data, rows=10, group=4)
    for fmt in ("parquet", "jsonl", "csv"):
        _predict(model, data, tmp_path / f"small.{fmt}", "--batch-size", "3")
        _predict(model, data, tmp_path / f"whole.{fmt}")
        assert not list(tmp_path.glob(".*.tmp*")), "temp files left behind"
    groups = pq.ParquetFile(tmp_path / "small.parquet").metadata
    assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == [3, 1, 3, 1, 2]
    assert pq.ParquetFile(tmp_path / "whole.parquet").metadata.num_row_groups == 3
    small = pq.read_table(tmp_path / "small.parquet").to_pylist()
    assert len(small) == 10
    _same_rows(small, pq.read_table(tmp_path / "whole.parquet").to_pylist())
    for fmt in ("jsonl", "csv"):
        got, want = _text_rows(tmp_path / f"small.{fmt}"), _text_rows(tmp_path / f"whole.{fmt}")
        assert len(got) == 10
        _same_rows(got, want)


SCORES = ("q_values", "candidate_scores")


def _same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Equal rows; the scores up to float rounding (a matrix product's last bit depends on
    how many rows it multiplies at once), everything else exactly."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert {k: v for k, v in g.items() if k not in SCORES} == {
            k: v for k, v in w.items() if k not in SCORES
        }
        for key in SCORES:
            if key in w:
                np.testing.assert_allclose(_floats(g[key]), _floats(w[key]), rtol=1e-6, atol=1e-7)


def _floats(value: Any) -> list[float]:
    return [float(v) for v in (json.loads(value) if isinstance(value, str) else value)]


def _text_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    import csv

    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_scoring_pulls_one_batch_at_a_time(dqn_dir: Path) -> None:
    """`score_batches` hands each scored batch on before it reads the next: nothing
    accumulates between the reader and the writer."""
    table = pq.read_table(dqn_dir.parent / "data/train.parquet").slice(0, 9)
    read: list[int] = []

    def batches() -> Any:
        for start in range(0, 9, 3):
            read.append(start)
            yield table.slice(start, 3)

    scored = Predictor(dqn_dir).score_batches(batches(), "t")
    for i, out in enumerate(scored):
        assert len(read) == i + 1 and out.num_rows == 3
    assert read == [0, 3, 6]


def test_a_bad_row_in_a_later_batch_leaves_no_output(dqn_dir: Path, tmp_path: Path) -> None:
    """Rows 5 and 8 (of the third and fifth batch: two were scored and written before)
    break the rules: exit 3 counting both, with the table's own row numbers; no output and
    no temp file, an older output kept as it was."""
    table = pq.read_table(dqn_dir.parent / "data/train.parquet").slice(0, 10)
    states = table.column("state_features").to_pylist()
    for row in (5, 8):
        states[row] = [(k, float("nan")) for k, _ in states[row]]
    col = table.schema.get_field_index("state_features")
    bad = table.set_column(col, "state_features", pa.array(states, table.schema.field(col).type))
    pq.write_table(bad, tmp_path / "bad.parquet", row_group_size=4)
    out = tmp_path / "scores.jsonl"
    out.write_text("older output\n")
    result = run_module("reagent_lite.predict", "--model", str(dqn_dir), "--data",
                        str(tmp_path / "bad.parquet"), "--output", str(out),
                        "--batch-size", "3", timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stderr[-2000:]
    assert "column 'state_features': 2 bad rows" in result.stderr
    assert "(e.g. row 5:" in result.stderr and "Traceback" not in result.stderr
    assert out.read_text() == "older output\n"
    assert not list(tmp_path.glob(".*.tmp*"))


def test_state_features_are_required_of_the_whole_table_not_each_batch(
    dqn_dir: Path, tmp_path: Path
) -> None:
    """A first batch with none of the model's features scores (the later ones have them);
    a table with none anywhere is the usual error."""
    table = pq.read_table(dqn_dir.parent / "data/train.parquet").slice(0, 6)
    col = table.schema.get_field_index("state_features")
    states = table.column("state_features").to_pylist()
    foreign = [[("9999", 1.0)]] * 3 + states[3:]
    mixed = table.set_column(col, "state_features", pa.array(foreign, table.schema.field(col).type))
    scored = Predictor(dqn_dir).score(mixed, batch_size=3)
    assert scored.num_rows == 6 and scored.column("best_action").null_count == 0
    none = mixed.slice(0, 3)
    with pytest.raises(reagent_lite.DataError, match="no row holds any of the model's state"):
        Predictor(dqn_dir).score(none, batch_size=1)
