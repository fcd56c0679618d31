"""The exported JSON Schemas: in sync with the models, and enough to check configs without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from reagent_lite.config.schema import SCHEMA_DIR, SCHEMA_FILES, drifted, load_schema
from tests.config.conftest import REPO, minimal_dqn

SAMPLES = REPO / "sample_configs"


def test_schema_files_match_models() -> None:
    assert drifted() == [], "run: python -m reagent_lite.config.schema"


def test_check_flag_detects_drift(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "reagent_lite.config.schema"]
    ok = subprocess.run([*cmd, "--check"], cwd=REPO, capture_output=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    written = subprocess.run([*cmd, "--out-dir", str(tmp_path)], cwd=REPO, timeout=60)
    assert written.returncode == 0
    for name in SCHEMA_FILES:
        assert (tmp_path / name).read_text() == (SCHEMA_DIR / name).read_text()
    stale = tmp_path / "dqn_workflow.schema.json"
    stale.write_text(stale.read_text().replace("Discount factor", "Discount"))
    bad = subprocess.run(
        [*cmd, "--check", "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    assert "dqn_workflow.schema.json: out of date" in bad.stderr


def _schema_for(path: Path, data: dict) -> Path:
    if "$schema" in data:
        return (path.parent / data["$schema"]).resolve()
    # Configs shipped as Horizon wrote them carry no $schema; their folder says the kind.
    name = "parametric_dqn" if "parametric" in path.parent.name else "dqn"
    return SCHEMA_DIR / f"{name}_workflow.schema.json"


def test_sample_configs_reference_existing_schemas() -> None:
    files = sorted(SAMPLES.rglob("*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        if path.name != "horizon_dqn_example.json":
            assert "$schema" in data, f"{path} has no $schema"
            assert not Path(data["$schema"]).is_absolute()
        schema = _schema_for(path, data)
        assert schema.is_file(), f"{path}: $schema {schema} does not exist"
        assert schema.parent == SCHEMA_DIR


# Runs in a fresh interpreter so that `torch` in sys.modules means *this* code imported it.
_VALIDATE_WITHOUT_TORCH = r"""
import json, sys
from pathlib import Path
import jsonschema
samples = Path(sys.argv[1])
schemas = Path(sys.argv[2])
count = 0
for path in sorted(samples.rglob("*.json")):
    data = json.loads(path.read_text())
    if "$schema" in data:
        schema_path = (path.parent / data["$schema"]).resolve()
    else:
        kind = "parametric_dqn" if "parametric" in path.parent.name else "dqn"
        schema_path = schemas / f"{kind}_workflow.schema.json"
    schema = json.loads(schema_path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(data)
    count += 1
assert "torch" not in sys.modules, "jsonschema validation imported torch"

from reagent_lite.config import load_config, config_class
for path in sorted(samples.rglob("*.json")):
    kind = "parametric_dqn" if "parametric" in path.name else "dqn"
    load_config(path, config_class(kind))
assert "torch" not in sys.modules, "loading a config imported torch"
print("validated", count)
"""


def test_sample_configs_validate_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _VALIDATE_WITHOUT_TORCH, str(SAMPLES), str(SCHEMA_DIR)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "validated" in proc.stdout


def test_schema_rejects_what_the_models_reject() -> None:
    validator = jsonschema.Draft202012Validator(load_schema("dqn_workflow.schema.json"))
    assert validator.is_valid(minimal_dqn())
    assert validator.is_valid({**minimal_dqn(), "$schema": "x", "rl": {"maxq_learning": 1}})
    bad = [
        {**minimal_dqn(), "bogus": 1},
        {**minimal_dqn(), "epochs": "10"},
        {**minimal_dqn(), "rl": {"gamma": 2}},
        {**minimal_dqn(), "actions": []},
        {**minimal_dqn(), "num_nodes": 2},
        {**minimal_dqn(), "init_method": "tcp://x:1"},
        {**minimal_dqn(), "training": {"optimizer": "adagrad"}},
        {**minimal_dqn(), "rainbow": {"categorical": True}},
        {"training_data_path": "x", "model_output_path": "y"},
    ]
    for data in bad:
        assert not validator.is_valid(data), data


def test_schema_describes_every_property() -> None:
    for name in SCHEMA_FILES:
        schema = load_schema(name)
        objects = [schema, *schema["$defs"].values()]
        for obj in objects:
            for key, prop in obj.get("properties", {}).items():
                assert prop.get("description"), f"{name}: {key} has no description"


def test_schema_states_every_plain_default() -> None:
    """Every field with a default that is a value (not a nested block) shows it in the
    schema, as in docs/CONFIG.md: editors and users read defaults from there."""
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], schema: dict, defs: dict) -> None:
        if model in seen:
            return
        seen.add(model)
        for key, field in model.model_fields.items():
            name = field.alias or key
            prop = schema["properties"][name]
            sub = field.annotation
            nested = isinstance(sub, type) and issubclass(sub, BaseModel)
            if nested:
                ref = prop.get("$ref") or next(
                    (p["$ref"] for p in prop.get("anyOf", []) if "$ref" in p), None
                )
                if ref:
                    walk(sub, defs[ref.rsplit("/", 1)[1]], defs)
                continue
            has_default = field.default is not PydanticUndefined or field.default_factory
            if has_default:
                assert "default" in prop, f"{model.__name__}.{name}: default not in the schema"

    for name, cls in SCHEMA_FILES.items():
        seen.clear()
        schema = load_schema(name)
        walk(cls, schema, schema["$defs"])
