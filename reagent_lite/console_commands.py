"""The console subcommands that are no tool's `python -m` module: `train` (the workflow the
config names) and `configs list|copy` (the shipped sample configs). Torch-free until a
run starts."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from reagent_lite.errors import ConfigError
from reagent_lite.resources import sample_config, sample_config_names, sample_configs_dir


def train(argv: list[str], prog: str) -> None:
    """`reagent-lite train --config x.json ...`: the flags of every workflow; the kind is
    the config's `workflow` key, else the registry's rule for a config without it."""
    from reagent_lite.cli import parse_workflow_args
    from reagent_lite.config.loader import read_config_file
    from reagent_lite.config.overrides import apply_overrides
    from reagent_lite.kinds.registry import infer_kind, resolve_kind
    from reagent_lite.runner import main as run_workflow

    args = parse_workflow_args(argv, prog=prog)  # bad flags exit 2 before the file is read
    data = read_config_file(args.config)
    if isinstance(data, dict) and args.overrides:
        # `workflow=...` on the line picks the kind, as it would in the file.
        data = apply_overrides(data, list(args.overrides))
    spec = resolve_kind(infer_kind(data))
    run_workflow(spec, argv, prog=prog)


def configs(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description="The shipped sample configs.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="{list,copy}")
    sub.add_parser("list", help="one line per sample config: its name and what it runs")
    copy = sub.add_parser("copy", help="copy a sample config to edit it")
    copy.add_argument("name", help="a name from `list` (the file name alone will do)")
    copy.add_argument("dest", type=Path, help="file to write, or a directory to write into")
    copy.add_argument("--force", action="store_true", help="replace DEST if it exists")
    args = parser.parse_args(argv)
    if args.action == "list":
        names = sample_config_names()
        width = max(map(len, names))
        for name in names:
            print(f"{name:<{width}}  {describe(sample_configs_dir() / name)}")
        return
    source = sample_config(_full_name(args.name))
    dest: Path = args.dest / source.name if args.dest.is_dir() else args.dest
    if dest.exists() and not args.force:
        raise ConfigError(f"{dest}: exists already (give --force to replace it)")
    if not dest.parent.is_dir():
        raise ConfigError(f"{dest}: its directory {dest.parent} does not exist")
    shutil.copyfile(source, dest)
    print(f"copied {source.relative_to(sample_configs_dir()).as_posix()} to {dest}")


def _full_name(name: str) -> str:
    """`cartpole_dqn`, `cartpole_dqn.json` or `discrete_action/cartpole_dqn.json`."""
    names = sample_config_names()
    if name in names:
        return name
    stem = name.removesuffix(".json")
    matches = [n for n in names if Path(n).stem == stem]
    if len(matches) == 1:
        return matches[0]
    raise ConfigError(
        f"configs copy: no sample config named {name!r} (expected one of {names}; "
        "see `reagent-lite configs list`)"
    )


def describe(path: Path) -> str:
    """What a sample config runs, read from its keys (so it cannot drift from the file)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    from reagent_lite.kinds.registry import infer_kind

    nodes = int(data.get("num_nodes", 1))
    parts = [f"{infer_kind(data)}, {nodes} node{'s' if nodes > 1 else ''}"]
    sample = data.get("sample_data")
    if isinstance(sample, dict):
        kind = sample.get("kind", "gym")
        source = f"gym {sample.get('env', 'CartPole-v1')}" if kind == "gym" else kind
        parts.append(f"generates its data ({source}, {sample.get('episodes', 200)} episodes)")
    else:
        parts.append(f"reads {data.get('training_data_path')}")
    online = data.get("evaluation", {}).get("online_episodes", 0)
    if online:
        parts.append(f"online check over {online} episodes")
    return "; ".join(parts)
