"""Config numbers are finite and bounded, oversized or nested input is one bounded
message, and a network + minibatch that cannot fit is refused before allocating."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reagent_lite.config import load_config
from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError
from reagent_lite.training.loop import Workflow
from tests.data.test_ingest import ACTIONS, rows, write

BASE = {"training_data_path": "t.parquet", "model_output_path": "out", "actions": ["0", "1"]}


def _load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, DQNWorkflowConfig)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message[:400]
    return message


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"rendezvous_timeout_s": 1e300}, "rendezvous_timeout_s"),
        ({"collective_timeout_s": 1e12}, "collective_timeout_s"),
        ({"seed": 2**64}, "seed"),
        ({"epochs": 2**62}, "epochs"),
        ({"training": {"minibatch_size": 2**40}}, "training.minibatch_size"),
        ({"training": {"layers": [-1, 10**10, -1]}}, "training.layers[1]"),
        ({"actions": ["a" * 5_000_000, "b"]}, "actions[0]"),
        ({"training_data_path": "/x" * 100_000}, "training_data_path"),
    ],
)
def test_out_of_range_values_are_one_bounded_message(
    tmp_path: Path, override: dict[str, Any], key: str
) -> None:
    assert f"{key}:" in _load(tmp_path, json.dumps({**BASE, **override}))


def test_infinity_written_as_a_huge_number_is_refused(tmp_path: Path) -> None:
    text = json.dumps(BASE)[:-1] + ', "rendezvous_timeout_s": 1e400}'
    assert "finite" in _load(tmp_path, text)


def test_deeply_nested_json_is_refused(tmp_path: Path) -> None:
    text = '{"training_data_path": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "nested deeper" in _load(tmp_path, text)


def test_a_step_that_cannot_fit_is_refused_before_allocating(tmp_path: Path) -> None:
    data = write(tmp_path / "t.parquet", rows(100), 100)
    cfg = DQNWorkflowConfig(
        training_data_path=str(data),
        model_output_path=str(tmp_path / "out"),
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
        epochs=1,
        training={
            "layers": [-1, 1 << 20, 1 << 20, -1],
            "activations": ["relu", "relu", "linear"],
            "minibatch_size": 1 << 24,
        },
        evaluation={"calc_cpe_in_training": False},
    )
    wf = Workflow("dqn", cfg, DistContext.single("cpu"))
    with pytest.raises(ConfigError, match=r"need at least [\d.]+ GiB"):
        wf.setup()
    assert not hasattr(wf, "q_net"), "the network was built"
    wf.cleanup()
