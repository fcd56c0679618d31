"""The torch Preprocessor: each transform by hand, masking, JSON round trip, export."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from reagent_lite.errors import DataError
from reagent_lite.normalization import (
    MAX_FEATURE_VALUE,
    FeatureType,
    NormalizationParameters,
    Preprocessor,
    fit_normalization,
    load_normalization,
    save_normalization,
)

P = NormalizationParameters


def _run(params: dict[str, NormalizationParameters], rows: list[list[float]]) -> torch.Tensor:
    m = Preprocessor(list(params), params)
    x = torch.tensor(rows, dtype=torch.float32)
    return m(x, torch.ones_like(x))


def _col(p: NormalizationParameters, xs: list[float]) -> list[float]:
    return _run({"1": p}, [[v] for v in xs])[:, 0].tolist()


def test_binary_probability_continuous() -> None:
    assert _col(P(feature_type=FeatureType.BINARY), [0.0, 2.0, -1.0, 1.0]) == [0.0, 1.0, 1.0, 1.0]
    prob = _col(P(feature_type=FeatureType.PROBABILITY), [0.5, 0.75, 0.0, 1.0])
    np.testing.assert_allclose(
        prob, [0.0, math.log(3.0), math.log(0.01 / 0.99), math.log(99)], rtol=1e-5, atol=1e-6
    )
    cont = _col(P(feature_type=FeatureType.CONTINUOUS, mean=2.0, stddev=4.0), [10.0, -2.0, 1000.0])
    np.testing.assert_allclose(cont, [2.0, -1.0, MAX_FEATURE_VALUE], rtol=1e-6)


def test_boxcox() -> None:
    p = P(
        feature_type=FeatureType.BOXCOX, boxcox_lambda=0.5, boxcox_shift=1.0, mean=0.5, stddev=2.0
    )
    # base 4 → (√4 − 1)/0.5 = 2 → (2 − 0.5)/2 = 0.75
    np.testing.assert_allclose(_col(p, [3.0]), [0.75], rtol=1e-6)
    log = P(feature_type=FeatureType.BOXCOX, boxcox_lambda=0.0, boxcox_shift=0.0)
    np.testing.assert_allclose(_col(log, [math.e, 1.0]), [1.0, 0.0], atol=1e-6)
    # Below the shift the base is clamped, never NaN.
    assert all(math.isfinite(v) for v in _col(p, [-5.0]))


def test_quantile_interpolates_and_pads() -> None:
    params = {
        "1": P(feature_type=FeatureType.QUANTILE, quantiles=[0.0, 1.0, 3.0, 7.0]),
        "2": P(feature_type=FeatureType.QUANTILE, quantiles=[10.0, 20.0]),  # padded to 4 boundaries
    }
    xs = [-1.0, 0.0, 0.5, 1.0, 2.0, 5.0, 7.0, 100.0]
    out = _run(params, [[v, 15.0] for v in xs])
    expected = [0.0, 0.0, 0.5 / 3, 1 / 3, 1.5 / 3, 2.5 / 3, 1.0, 1.0]
    np.testing.assert_allclose(out[:, 0].tolist(), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out[:, 1].tolist(), [0.5] * len(xs), rtol=1e-6)


def test_enum_one_hot_with_unknown_value() -> None:
    params = {
        "4": P(feature_type=FeatureType.CONTINUOUS, mean=1.0),
        "9": P(feature_type=FeatureType.ENUM, possible_values=[1, 3, 7]),
        "5": P(feature_type=FeatureType.ENUM, possible_values=[0, 2]),
    }
    m = Preprocessor(["4", "9", "5"], params)
    assert m.out_dim == 6
    assert m.out_feature_names == ["4", "9=1", "9=3", "9=7", "5=0", "5=2"]
    x = torch.tensor([[1.0, 3.0, 2.0], [2.0, 5.0, 0.0], [3.0, 7.0, 1.0]])
    out = m(x, torch.ones_like(x))
    assert out.tolist() == [
        [0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        [1.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # 5 is no known value: all zeros
        [2.0, 0.0, 0.0, 1.0, 0.0, 0.0],
    ]


def test_continuous_action_and_passthrough() -> None:
    act = P(feature_type=FeatureType.CONTINUOUS_ACTION, min_value=0.0, max_value=10.0)
    np.testing.assert_allclose(
        _col(act, [0.0, 5.0, 10.0, 20.0]), [-1 + 1e-6, 0.0, 1 - 1e-6, 1 - 1e-6], atol=1e-7
    )
    constant = P(feature_type=FeatureType.CONTINUOUS_ACTION, min_value=3.0, max_value=3.0)
    assert _col(constant, [3.0, 4.0]) == [0.0, 0.0]
    assert _col(P(feature_type=FeatureType.DO_NOT_PREPROCESS), [0.25, -3.0]) == [0.25, -3.0]


def test_presence_masks_values_and_nan() -> None:
    params = {
        "1": P(feature_type=FeatureType.CONTINUOUS, mean=5.0, stddev=2.0),
        "2": P(feature_type=FeatureType.ENUM, possible_values=[0, 1, 2]),
        "3": P(feature_type=FeatureType.PROBABILITY),
        "4": P(feature_type=FeatureType.BOXCOX, boxcox_lambda=0.5, boxcox_shift=0.0),
        "5": P(feature_type=FeatureType.QUANTILE, quantiles=[0.0, 1.0]),
        "6": P(feature_type=FeatureType.BINARY),
    }
    m = Preprocessor(list(params), params)
    nan = float("nan")
    x = torch.tensor(
        [
            [nan, nan, nan, nan, nan, nan],  # absent, NaN in the slot
            [-1337.1337, 0.0, 1e30, -1e9, 0.5, 1.0],  # absent, magic values in the slot
            [7.0, 2.0, 0.5, 4.0, 0.5, 1.0],  # present
            [nan, 2.0, nan, 4.0, nan, 1.0],  # NaN although marked present → missing
        ]
    )
    presence = torch.tensor([[0.0] * 6, [0.0] * 6, [1.0] * 6, [1.0] * 6])
    out = m(x, presence)
    assert torch.isfinite(out).all()
    assert out[0].tolist() == [0.0] * m.out_dim
    assert out[1].tolist() == [0.0] * m.out_dim
    np.testing.assert_allclose(out[2].tolist(), [1.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.5, 1.0], atol=1e-6)
    np.testing.assert_allclose(out[3].tolist(), [0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 1.0], atol=1e-6)
    # A boolean mask works too.
    assert torch.equal(m(x, presence.bool()), out)


def _fitted() -> tuple[list[str], dict[str, NormalizationParameters], np.ndarray]:
    rng = np.random.default_rng(0)
    n = 2000
    cols = [
        rng.binomial(1, 0.5, n).astype(float),
        rng.uniform(0, 1, n),
        rng.integers(0, 4, n).astype(float),
        rng.normal(3, 2, n),
        np.exp(rng.normal(0, 1, n)),
        np.concatenate([rng.normal(0, 1, n // 2), rng.normal(500, 1, n // 2)]),
    ]
    x = np.stack(cols, axis=1)
    x[rng.random(x.shape) < 0.2] = np.nan
    ids = ["1", "2", "3", "4", "5", "6"]
    params = fit_normalization(x, ids)
    assert {p.feature_type for p in params.values()} >= {
        FeatureType.BINARY,
        FeatureType.ENUM,
        FeatureType.BOXCOX,
        FeatureType.QUANTILE,
    }
    return ids, params, x


def test_json_round_trip_gives_same_module_output(tmp_path: Path) -> None:
    ids, params, x = _fitted()
    save_normalization(tmp_path / "norm.json", params)
    loaded = load_normalization(tmp_path / "norm.json")
    assert loaded == params
    values = torch.from_numpy(x).float()
    presence = (~torch.isnan(values)).float()
    a = Preprocessor(ids, params)(values, presence)
    b = Preprocessor(ids, loaded)(values, presence)
    assert torch.equal(a, b)
    assert a.shape == (len(x), Preprocessor(ids, params).out_dim)
    assert torch.isfinite(a).all()


def test_missing_params_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no parameters for feature"):
        Preprocessor(["1", "2"], {"1": P(feature_type=FeatureType.BINARY)})


def test_empty_feature_list() -> None:
    m = Preprocessor([], {})
    assert m(torch.zeros(3, 0), torch.zeros(3, 0)).shape == (3, 0)


def test_export_with_dynamic_batch() -> None:
    ids, params, x = _fitted()
    m = Preprocessor(ids, params).eval()
    values = torch.from_numpy(x).float()
    presence = (~torch.isnan(values)).float()
    batch = torch.export.Dim("batch", min=1)
    ep = torch.export.export(
        m,
        (values[:8], presence[:8]),
        dynamic_shapes={"values": {0: batch}, "presence": {0: batch}},
    )
    exported = ep.module()
    for b in (1, 5, 333):
        assert torch.equal(exported(values[:b], presence[:b]), m(values[:b], presence[:b]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_gpu() -> None:
    ids, params, x = _fitted()
    m = Preprocessor(ids, params)
    values = torch.from_numpy(x).float()
    presence = (~torch.isnan(values)).float()
    cpu = m(values, presence)
    gpu = m.to("cuda")(values.cuda(), presence.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def _forward_ref(m: Preprocessor, x: torch.Tensor) -> torch.Tensor:
    present = ~torch.isnan(x)
    return m(torch.nan_to_num(x), present.to(torch.float32))


def test_normalize_rows_mixed_types_equals_forward() -> None:
    ids, params, x = _fitted()
    m = Preprocessor(ids, params)
    values = torch.tensor(x, dtype=torch.float32)
    want = _forward_ref(m, values)
    got = m.normalize_rows(values.clone(), chunk_rows=333)  # ENUM widens: a new tensor
    assert got.shape == (len(x), m.out_dim)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("extra", [None, FeatureType.DO_NOT_PREPROCESS])
def test_normalize_rows_affine_in_place_is_exact(extra: FeatureType | None) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(5, 3, (5000, 4)).astype(np.float32)
    x[rng.random(x.shape) < 0.25] = np.nan
    x[0, 0], x[1, 1] = 1e9, -1e9  # clamped
    params = {
        str(i): NormalizationParameters(feature_type=FeatureType.CONTINUOUS, mean=i, stddev=0.3)
        for i in range(4)
    }
    if extra is not None:
        params["3"] = NormalizationParameters(feature_type=extra)
    m = Preprocessor([str(i) for i in range(4)], params)
    values = torch.from_numpy(x.copy())
    want = _forward_ref(m, values)
    threads = torch.get_num_threads()
    got = m.normalize_rows(values, chunk_rows=1000)
    assert got.data_ptr() == values.data_ptr()  # in place
    assert torch.equal(got, want)
    assert torch.get_num_threads() == threads  # restored


@pytest.mark.parametrize("kind", ["boxcox", "log", "probability"])
def test_normalize_rows_does_not_depend_on_the_chunks(kind: str) -> None:
    # One transcendental feature (a 1-D run for ATen): every chunking gives the same bits.
    # Without padding, AVX-512's vector pow and glibc's scalar one differed in the last bit
    # for values in a chunk's tail (prepared row groups against streamed windows).
    param = {
        "boxcox": P(
            feature_type="BOXCOX", boxcox_lambda=0.4, boxcox_shift=6.0, mean=1.0, stddev=2.0
        ),
        "log": P(feature_type="BOXCOX", boxcox_lambda=0.0, boxcox_shift=6.0, mean=1.0, stddev=2.0),
        "probability": P(feature_type="PROBABILITY"),
    }[kind]
    rng = np.random.default_rng(5)
    x = rng.uniform(0.001, 0.999, (5000, 1)).astype(np.float32) * (
        4 if kind != "probability" else 1
    )
    m = Preprocessor(["0"], {"0": param})
    whole = m.normalize_rows(torch.from_numpy(x.copy()), chunk_rows=5000)
    for rows in (1, 7, 64, 700, 4999):
        assert torch.equal(m.normalize_rows(torch.from_numpy(x.copy()), chunk_rows=rows), whole)
