"""From a validated config to trained outputs: preflight, sample data, launch, workers."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

from reagent_lite.distributed.context import DistContext
from reagent_lite.distributed.launch import launch
from reagent_lite.distributed.plan import LaunchPlan, plan_launch
from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import ensure_writable_dir

log = logging.getLogger("reagent_lite")


def setup_logging(is_rank_zero: bool) -> None:
    """Rank 0 speaks; the other ranks only warn."""
    root = logging.getLogger("reagent_lite")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("[reagent-lite %(asctime)s] %(message)s", "%H:%M:%S")
        )
        root.addHandler(handler)
    root.setLevel(logging.INFO if is_rank_zero else logging.WARNING)
    root.propagate = False


def make_plan(cfg: Any, node_index: int, run_id: str | None) -> LaunchPlan:
    return plan_launch(
        num_nodes=cfg.num_nodes,
        node_index=node_index,
        use_gpu=cfg.use_gpu,
        # dp: one process drives every visible GPU through DataParallel (Workflow._wrap);
        # one process per GPU would leave G unsynchronised replicas.
        use_all_avail_gpus=cfg.use_all_avail_gpus and cfg.data_parallel == "ddp",
        init_method=cfg.init_method,
        run_id=run_id,
        env=os.environ,
        default_rendezvous_dir=Path(cfg.model_output_path).absolute(),
    )


def preflight(kind: str, cfg: Any, plan: LaunchPlan) -> None:
    """Fails fast (before any process group) on what would otherwise fail mid-run."""
    if plan.ranks[0] == 0:
        ensure_writable_dir(Path(cfg.model_output_path), "model_output_path")
        if cfg.sample_data is not None and not Path(cfg.training_data_path).exists():
            from reagent_lite.samples.generate import generate_sample_data

            log.info(
                "training_data_path %s does not exist: generating sample data",
                cfg.training_data_path,
            )
            made = generate_sample_data(
                cfg.sample_data,
                parametric=(kind == "parametric_dqn" and cfg.sample_data.kind == "gym"),
                training_data_path=cfg.training_data_path,
                eval_data_path=cfg.eval_data_path,
            )
            log.info("sample data: %d training rows, %d eval rows", made.train_rows, made.eval_rows)
    if plan.num_nodes == 1 and not Path(cfg.training_data_path).exists():
        raise ConfigError(
            f"training_data_path: '{cfg.training_data_path}' does not exist "
            "(expected a Parquet/JSONL file or directory, or a sample_data block to generate it)"
        )


def run_training(kind: str, cfg: Any, args: Any) -> None:
    plan = make_plan(cfg, args.node_index, getattr(args, "run_id", None))
    setup_logging(plan.ranks[0] == 0)
    log.info("%s workflow\n%s", kind, plan.describe())
    preflight(kind, cfg, plan)
    launch(
        plan,
        run_worker,
        (kind, cfg, bool(args.resume)),
        rendezvous_timeout_s=cfg.rendezvous_timeout_s,
        collective_timeout_s=cfg.collective_timeout_s,
    )
    if plan.ranks[0] == 0:
        out = Path(cfg.model_output_path)
        print(
            f"model: {out / 'model.pt2'}\nmetadata: {out / 'model_meta.json'}\nmetrics: {out / 'metrics.jsonl'}"
        )
        if importlib.util.find_spec("matplotlib") is not None:
            from reagent_lite.report import draw_report

            print(f"report: {draw_report(out)}")


def run_worker(ctx: DistContext, kind: str, cfg: Any, resume: bool) -> None:
    """What every rank runs once its process group is up."""
    from reagent_lite.training.loop import Workflow

    setup_logging(ctx.is_rank_zero)
    workflow = Workflow(kind, cfg, ctx, resume=resume)
    try:
        workflow.setup()
        workflow.train()
        workflow.save()
    finally:
        workflow.cleanup()
