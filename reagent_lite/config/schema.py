"""JSON Schema export of the workflow configs.

    python -m reagent_lite.config.schema            # (re)write schemas/*.schema.json
    python -m reagent_lite.config.schema --check    # exit 1 if they drifted from the models

From an installed package (no checkout) `--check` compares the schemas and config
reference shipped inside the package with its models; writing needs `--out-dir`, since an
installed package's own files are never rewritten.

The schemas describe the config *file* as `load_config` accepts it: the models, plus the
`$schema` key, plus Horizon's compatibility keys (marked `deprecated`), so that a
Horizon-era config validates in an editor just as it loads. Neither this module nor
`jsonschema` validation needs torch.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from reagent_lite.config.horizon import _ANY, HORIZON_IGNORED, HORIZON_RENAMED
from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.config.reference import REFERENCE_PATH, render_reference
from reagent_lite.resources import in_checkout, schema_dir

SCHEMA_DIR = schema_dir()
SCHEMA_FILES: dict[str, type[BaseModel]] = {
    "dqn_workflow.schema.json": DQNWorkflowConfig,
    "parametric_dqn_workflow.schema.json": ParametricDQNWorkflowConfig,
}
# Which `$defs` entry holds each nested block of the config.
_BLOCK_DEFS = {
    "rl": "RLParameters",
    "rainbow": "RainbowParameters",
    "training": "TrainingParameters",
}


def build_schema(cls: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config file for `cls`."""
    schema = cls.model_json_schema(mode="validation")
    props: dict[str, Any] = schema["properties"]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "properties": {
            "$schema": {
                "type": "string",
                "description": "Path or URL of this JSON Schema (ignored by the loader).",
            },
            **props,
            "in_training_cpe": {
                "anyOf": [{"type": "null"}, {"type": "object"}],
                "deprecated": True,
                "description": "Horizon compatibility: null turns off evaluation."
                "calc_cpe_in_training, an object turns it on (its keys are ignored).",
            },
        },
    }
    for obj_path, keys in HORIZON_IGNORED.items():
        target = schema if obj_path == "" else schema["$defs"][_BLOCK_DEFS[obj_path]]
        for key, compat in keys.items():
            entry: dict[str, Any] = {
                "deprecated": True,
                "description": f"Horizon compatibility only, ignored: {compat.note}.",
            }
            if compat.accepted is not _ANY:
                assert isinstance(compat.accepted, tuple)
                entry["enum"] = list(dict.fromkeys(compat.accepted))
            target["properties"][key] = entry
    for obj_path, renames in HORIZON_RENAMED.items():
        target = schema["$defs"][_BLOCK_DEFS[obj_path]]
        for old, new in renames.items():
            target["properties"][old] = {
                "anyOf": [{"type": "boolean"}, {"type": "null"}],
                "deprecated": True,
                "description": f"Horizon name of {obj_path}.{new}.",
            }
    # init_method is required when num_nodes > 1 (also checked by the model).
    schema["if"] = {"properties": {"num_nodes": {"minimum": 2}}, "required": ["num_nodes"]}
    schema["then"] = {
        "required": ["init_method"],
        "properties": {"init_method": {"type": "string"}},
    }
    return schema


def all_schemas() -> dict[str, dict[str, Any]]:
    """File name → schema, for every workflow."""
    return {name: build_schema(cls) for name, cls in SCHEMA_FILES.items()}


def render(schema: dict[str, Any]) -> str:
    """The exact text written to disk (stable, so drift checks compare text)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write_schemas(out_dir: Path = SCHEMA_DIR) -> list[Path]:
    """Write every schema into `out_dir`; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in all_schemas().items():
        path = out_dir / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


def drifted(out_dir: Path = SCHEMA_DIR) -> list[str]:
    """Names of schema files in `out_dir` that are missing or differ from the models."""
    bad = []
    for name, schema in all_schemas().items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render(schema):
            bad.append(name)
    return bad


def load_schema(name: str, schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    """A schema as written on disk (a deep copy callers may modify)."""
    data: dict[str, Any] = json.loads((schema_dir / name).read_text(encoding="utf-8"))
    return copy.deepcopy(data)


def main(argv: list[str] | None = None, prog: str = "python -m reagent_lite.config.schema") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write the workflow config JSON Schemas (or check they are up to date).",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the files drifted")
    parser.add_argument(
        "--out-dir",
        "--out_dir",
        dest="out_dir",
        type=Path,
        default=None,
        help=f"schema directory (default: {SCHEMA_DIR})",
    )
    args = parser.parse_args(argv)
    if args.out_dir is None:
        if not args.check and not in_checkout():
            print(
                "--out-dir: required outside a source checkout (the installed package's "
                "own schemas are never rewritten)",
                file=sys.stderr,
            )
            return 2
        args.out_dir = SCHEMA_DIR
    if args.check:
        bad = drifted(args.out_dir)
        if args.out_dir == SCHEMA_DIR and (
            not REFERENCE_PATH.is_file()
            or REFERENCE_PATH.read_text(encoding="utf-8") != render_reference()
        ):
            bad.append(str(REFERENCE_PATH))
        for name in bad:
            print(
                f"{args.out_dir / name}: out of date with the config models; run {prog}",
                file=sys.stderr,
            )
        if not bad:
            print(f"OK: the schemas in {args.out_dir} match the config models")
        return 1 if bad else 0
    for path in write_schemas(args.out_dir):
        print(f"wrote {path}")
    if args.out_dir == SCHEMA_DIR:
        REFERENCE_PATH.write_text(render_reference(), encoding="utf-8")
        print(f"wrote {REFERENCE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
