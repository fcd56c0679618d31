"""Files the tool loads never run code: every entry point refuses a crafted file with a
clear error, and the payload's marker file never appears."""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import file_sha256
from reagent_lite.predict import Predictor
from reagent_lite.safe_load import check_pt2
from reagent_lite.training import checkpoint as ckpt
from tests.conftest import run_module
from tests.data.test_ingest import rows, write
from tests.training.runs import run_workflow as _run
from tests.training.runs import tiny_dqn_config


class Payload:
    """Unpickling this creates `marker`: proof that code from the file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _config(tmp: Path, **extra: Any) -> DQNWorkflowConfig:
    return tiny_dqn_config(tmp, **{"epochs": 1, **extra})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("model")
    _run(_config(tmp), save=True)
    return tmp / "out"


def test_warm_start_with_a_pickle_payload_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "model_state.pt"
    torch.save({"q_net": {}, "x": Payload(marker)}, evil)
    cfg = _config(tmp_path, training={"warm_start_model_path": str(evil)})
    with pytest.raises(ConfigError, match=r"warm_start_model_path.*cannot be read"):
        _run(cfg)
    assert not marker.exists()


def test_checkpoint_with_a_pickle_payload_is_refused_on_resume(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    _run(cfg)
    newest = ckpt.latest_checkpoint(tmp_path / "out")
    assert newest is not None
    marker = tmp_path / "marker"
    state = ckpt.load_checkpoint(newest)
    state["history"] = [Payload(marker)]
    torch.save(state, newest)
    with pytest.raises(ConfigError, match="cannot be read"):
        _run(cfg, resume=True)
    assert not marker.exists()


def _rewrite(src: Path, dst: Path, change: Any) -> None:
    """dst: src's archive with `change(name, data) -> data | None` applied per member
    (None drops it); `change("", b"")` may return extra members as a dict."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/", 1)[0] + "/"
        for name in zin.namelist():
            data = change(name[len(root) :], zin.read(name))
            if data is not None:
                zout.writestr(name, data)
        for name, data in (change("", b"") or {}).items():
            zout.writestr(root + name, data)


def _pickled(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _crafted(model_dir: Path, tmp_path: Path, how: str, marker: Path) -> Path:
    out = tmp_path / how
    out.mkdir()
    meta = json.loads((model_dir / "model_meta.json").read_text())

    def change(name: str, data: bytes) -> Any:
        if how == "sample_inputs" and name.startswith("data/sample_inputs/"):
            return _pickled(Payload(marker))
        if how == "pickled_weight" and name == "data/weights/model_weights_config.json":
            cfg = json.loads(data)
            first = next(iter(cfg["config"].values()))
            first["use_pickle"] = True
            return json.dumps(cfg)
        if how == "pickled_weight" and name == "data/weights/weight_0":
            return _pickled(Payload(marker))
        if how in ("guard", "target", "expr") and name.startswith("models/"):
            model = json.loads(data)
            code = f"open({str(marker)!r}, 'w') is None"
            if how == "guard":
                model["guards_code"] = [code]
            elif how == "target":
                model["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"
            else:
                values = model["graph_module"]["graph"]["tensor_values"]
                for v in values.values():
                    for size in v["sizes"]:
                        if "as_expr" in size:
                            size["as_expr"]["expr_str"] = f"Symbol('s1') if {code} else 1"
            return json.dumps(model)
        return data

    _rewrite(model_dir / "model.pt2", out / "model.pt2", change)
    # Whoever can replace model.pt2 can rewrite the meta's digest: the archive check must
    # refuse a crafted archive that the meta vouches for.
    meta["model_sha256"] = file_sha256(out / "model.pt2")
    (out / "model_meta.json").write_text(json.dumps(meta))
    return out


@pytest.mark.parametrize("how", ["sample_inputs", "pickled_weight", "guard", "target", "expr"])
def test_predict_refuses_a_crafted_model_archive(model_dir: Path, tmp_path: Path, how: str) -> None:
    marker = tmp_path / "marker"
    crafted = _crafted(model_dir, tmp_path, how, marker)
    with pytest.raises(ConfigError, match="refused"):
        Predictor(crafted)
    assert not marker.exists()


def test_without_the_check_torch_runs_the_payload(model_dir: Path, tmp_path: Path) -> None:
    # What the check prevents is real: torch's own loader unpickles sample inputs (it
    # retries them without weights_only when the safe load fails).
    marker = tmp_path / "marker"
    crafted = _crafted(model_dir, tmp_path, "sample_inputs", marker)
    with contextlib.suppress(Exception):
        torch.export.load(str(crafted / "model.pt2"))
    assert marker.exists()


def test_our_own_model_passes_and_a_truncated_one_is_one_line(
    model_dir: Path, tmp_path: Path
) -> None:
    check_pt2(model_dir / "model.pt2", "--model")
    Predictor(model_dir)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "model_meta.json").write_text((model_dir / "model_meta.json").read_text())
    data = (model_dir / "model.pt2").read_bytes()
    (cut / "model.pt2").write_bytes(data[: len(data) // 2])
    # The meta names the digest of the model it was written with ...
    with pytest.raises(ConfigError, match="the files come from different runs"):
        Predictor(cut)
    # ... and with the cut file's digest, the archive itself is refused in one line.
    meta = json.loads((cut / "model_meta.json").read_text())
    meta["model_sha256"] = file_sha256(cut / "model.pt2")
    (cut / "model_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"not a readable torch\.export archive") as err:
        Predictor(cut)
    assert "\n" not in str(err.value)


def test_predict_cli_broken_inputs_are_one_line_with_exit_2(
    model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "rows.parquet"
    write(data, rows(20), 20)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.pt2").write_bytes((model_dir / "model.pt2").read_bytes())
    (broken / "model_meta.json").write_text('{"workflow": "dqn", "actions": [')
    cases = {
        "cannot be read as JSON": ["--model", str(broken), "--output", str(tmp_path / "a.parquet")],
        "is a directory": ["--model", str(model_dir), "--output", str(tmp_path)],
    }
    for expected, args in cases.items():
        result = run_module("reagent_lite.predict", "--data", str(data), *args, timeout=120)
        assert result.returncode == 2, result.stderr[-2000:]
        assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
