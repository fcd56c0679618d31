"""What `workflows/*.py` call: parse flags → load config → check → dry run or train.

Everything up to the hand-off to `reagent_lite.training.entry.run_training` is cheap and
torch-free, so a bad config or flag fails in well under a second with exit code 2,
before any process group exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reagent_lite.cli import WorkflowArgs, configure_logging, parse_workflow_args, run_cli
from reagent_lite.config import WorkflowConfig, load_config
from reagent_lite.errors import ConfigError
from reagent_lite.extras import check_extras
from reagent_lite.kinds.registry import KindSpec, resolve_kind


def main(kind: KindSpec | str, argv: list[str] | None = None, prog: str | None = None) -> None:
    """Entry point of the registered workflow kind `kind` (or its name); exits with the
    error's code on failure."""
    run_cli(lambda: _main(resolve_kind(kind) if isinstance(kind, str) else kind, argv, prog))


def _main(kind: KindSpec, argv: list[str] | None, prog: str | None) -> None:
    configure_logging()
    args = parse_workflow_args(argv, prog=prog or kind.command)
    cfg: WorkflowConfig = load_config(args.config, kind.config, overrides=list(args.overrides))
    check_node_index(cfg, args.node_index, str(args.config))
    # Absolute paths from here on, so every process and node means the same files.
    cfg = cfg.resolved()
    if args.dry_run:
        print(describe_dry_run(kind, cfg, args))
        check_extras(cfg)  # what the run would refuse first, the dry run refuses too
        if args.node_index == 0:
            from reagent_lite.training.entry import check_finished_model

            check_finished_model(cfg, resume=args.resume, overwrite=args.overwrite)
        _require_data(kind, cfg)
        print("\n".join(_sample_lines(kind, cfg)))
        return
    # Before torch is imported: OpenMP reads its wait policy only when it loads.
    from reagent_lite.openmp_env import choose_wait_policy_early

    choose_wait_policy_early()
    from reagent_lite.training.entry import run_training

    out = run_training(kind.load(), cfg, args, cli_logging=True)
    if out is not None:
        print(
            f"model: {out / 'model.pt2'}\nmetadata: {out / 'model_meta.json'}\n"
            f"metrics: {out / 'metrics.jsonl'}"
        )
        if (out / "report.png").is_file():
            print(f"report: {out / 'report.png'}")


def check_node_index(cfg: WorkflowConfig, node_index: int, source: str) -> None:
    """`ConfigError` unless 0 ≤ node_index < num_nodes."""
    if not 0 <= node_index < cfg.num_nodes:
        raise ConfigError(
            f"{source}: --node_index: must be in [0, {cfg.num_nodes}) because num_nodes is "
            f"{cfg.num_nodes} (got {node_index})"
        )


def describe_dry_run(kind: KindSpec, cfg: WorkflowConfig, args: WorkflowArgs) -> str:
    """The resolved plan: config, launch layout, data shards and outputs."""
    lines = [
        f"config: {Path(args.config).resolve()}",
        f"workflow: {kind.name}",
        f"run_id: {args.run_id or '(derived at launch)'}",
        f"resume: {args.resume}",
    ]
    world_size, plan_text = _launch_plan(cfg, args)
    lines += ["launch:", *("  " + line for line in plan_text.splitlines())]
    from reagent_lite.dry_run import hyperparameter_lines

    shards = _shards(cfg.training_data_path, world_size)
    lines += hyperparameter_lines(cfg, world_size, shards, list(args.overrides))
    lines.append("training data:")
    lines += ["  " + line for line in _data_lines(cfg.training_data_path, world_size, cfg)]
    if cfg.eval_data_path is not None:
        lines.append(f"eval data: {cfg.eval_data_path} ({_exists(cfg.eval_data_path, cfg)})")
    out = Path(cfg.model_output_path)
    lines += [
        f"outputs: {out} ({'writable' if _writable(out) else 'NOT WRITABLE'})",
        f"  {out / 'model.pt2'}",
        f"  {out / 'model_meta.json'}",
        f"  {out / 'metrics.jsonl'}",
        f"  {out / 'checkpoints'}/",
    ]
    return "\n".join(lines)


def _launch_plan(cfg: WorkflowConfig, args: WorkflowArgs) -> tuple[int, str]:
    from reagent_lite.training.entry import make_plan

    plan = make_plan(cfg, args.node_index, args.run_id)
    return plan.world_size, plan.describe()


def _shards(path: str, world_size: int) -> list[Any] | None:
    if not Path(path).exists():
        return None
    from reagent_lite.data.readers import shard_plan

    return shard_plan(path, world_size)


def _sample_lines(spec: KindSpec, cfg: WorkflowConfig) -> list[str]:
    """A sample of each table checked as training would; the features' types."""
    from reagent_lite.dry_run import check_sample, feature_type_lines

    if not Path(cfg.training_data_path).exists():
        return ["data sample: none yet (sample_data will generate the data)"]
    lines, kind = ["data sample:"], spec.load()
    sample, what = check_sample(kind, cfg, cfg.training_data_path)
    lines.append(f"  training: {what}")
    if cfg.eval_data_path is not None and Path(cfg.eval_data_path).exists():
        lines.append(f"  eval: {check_sample(kind, cfg, cfg.eval_data_path)[1]}")
    return lines + feature_type_lines(kind, cfg, sample)


def _data_lines(path: str, world_size: int, cfg: WorkflowConfig) -> list[str]:
    if not Path(path).exists():
        if cfg.sample_data is not None:
            s = cfg.sample_data
            source = f"gym env {s.env}" if s.kind == "gym" else s.kind
            return [
                f"{path}: missing, data will be generated by rank 0 "
                f"({source}, {s.episodes} episodes, {s.policy} logging policy)"
            ]
        return [f"{path}: MISSING (and no sample_data block to generate it)"]
    from reagent_lite.data.readers import shard_plan

    shards: list[Any] = shard_plan(path, world_size)
    return [f"{path}: {world_size} shard(s)", *str("\n".join(map(str, shards))).splitlines()]


def _require_data(kind: KindSpec, cfg: WorkflowConfig) -> None:
    """What the run would refuse before training, the dry run refuses too (same codes)."""
    from reagent_lite.training.entry import check_input_paths

    missing = not Path(cfg.training_data_path).exists()
    if missing and cfg.sample_data is None:
        raise ConfigError(
            f"training_data_path: '{cfg.training_data_path}' does not exist and the config "
            "has no sample_data block to generate it"
        )
    check_input_paths(cfg, will_generate=missing)
    if not _writable(Path(cfg.model_output_path)):
        raise ConfigError(
            f"model_output_path: '{cfg.model_output_path}' cannot be created or written "
            "(expected a writable directory)"
        )
    from reagent_lite.data.readers import empty_like
    from reagent_lite.data.schema import check_columns

    # The data's columns (and Parquet's types) without reading rows: a table that training
    # would reject fails the dry run too.
    schema = kind.load().schema(cfg)
    for path in (cfg.training_data_path, cfg.eval_data_path):
        if path is not None and Path(path).exists():
            table, typed = empty_like(path)
            check_columns(table, schema, path, types=typed)


def _exists(path: str, cfg: WorkflowConfig) -> str:
    if Path(path).exists():
        return "exists"
    return "missing, will be generated" if cfg.sample_data is not None else "MISSING"


def _writable(path: Path) -> bool:
    # The nearest existing ancestor decides whether the directory can be created.
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
