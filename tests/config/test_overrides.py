"""key.path=value overrides: parsing, merging, and the command line validating the result
exactly like a file (exit 2, did-you-mean), shown by --dry_run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reagent_lite.config.overrides import apply_overrides, parse_override
from reagent_lite.errors import ConfigError
from tests.config.conftest import REPO, minimal_dqn
from tests.config.test_cli import run_workflow


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("epochs=5", ("epochs", 5)),
        ("training.learning_rate=1e-4", ("training.learning_rate", 1e-4)),
        ("use_gpu=false", ("use_gpu", False)),
        ("eval_data_path=null", ("eval_data_path", None)),
        ("training.layers=[-1, 64, -1]", ("training.layers", [-1, 64, -1])),
        ("model_output_path=/tmp/out dir", ("model_output_path", "/tmp/out dir")),
        ("actions=a=b", ("actions", "a=b")),  # only the first = splits
        ("rl.gamma=NaN", ("rl.gamma", "NaN")),  # not JSON: a string, refused by validation
    ],
)
def test_values_parse_as_json_else_strings(text: str, expected: tuple[str, object]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["epochs", "=5", "training..lr=1", ".x=1"])
def test_malformed_overrides_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match=r"expected key\.path=value"):
        parse_override(text)


def test_apply_creates_blocks_and_leaves_the_input_alone() -> None:
    data = {"epochs": 1, "training": {"layers": [-1, -1]}}
    merged = apply_overrides(data, ["training.learning_rate=0.5", "rl.gamma=0.9", "epochs=3"])
    assert merged == {
        "epochs": 3,
        "training": {"layers": [-1, -1], "learning_rate": 0.5},
        "rl": {"gamma": 0.9},
    }
    assert data == {"epochs": 1, "training": {"layers": [-1, -1]}}
    with pytest.raises(ConfigError, match="epochs is 1, not an object"):
        apply_overrides(data, ["epochs.value=2"])


def test_cli_overrides_are_applied_and_shown_by_dry_run(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**minimal_dqn(), "sample_data": {"kind": "gym"}}))
    proc = run_workflow(
        ["--config", str(path), "--dry_run", "epochs=7", "training.learning_rate=1e-4"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "overrides: epochs=7 training.learning_rate=0.0001" in proc.stdout
    assert "epochs: 7" in proc.stdout and "learning_rate: 0.0001" in proc.stdout


def test_layers_override_alone_is_enough(tmp_path: Path) -> None:
    # The default activations used to keep three entries and refuse a one-hidden-layer net.
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**minimal_dqn(), "sample_data": {"kind": "gym"}}))
    proc = run_workflow(
        ["--config", str(path), "--dry_run", "training.layers=[-1,64,-1]"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "activations: ['relu', 'linear']" in proc.stdout


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("training.learning_rat=1e-4", "training.learning_rat: unknown key; did you mean 'learning_rate'?"),
        ("epochs=ten", "epochs: input should be a valid integer"),
        ("rl.gamma=1.5", "rl.gamma: input should be less than or equal to 1"),
        ("epochs", "override 'epochs': expected key.path=value"),
    ],
)  # fmt: skip
def test_bad_cli_overrides_exit_2_naming_the_key(
    tmp_path: Path, override: str, expected: str
) -> None:
    path = REPO / "sample_configs/ci/dqn_1node.json"
    proc = run_workflow(["--config", str(path), "--dry_run", override], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
