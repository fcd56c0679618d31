"""The one training loop both workflows share: setup / train / save / cleanup.

A `Workflow` runs inside every rank. It asks its `DistContext` only for collectives and
for `is_rank_zero`; the kind (dqn or parametric_dqn) supplies tensors and networks, the
step runner (`steps.py`) the optimizer steps, `epoch_end.py` what follows each epoch,
`resuming.py` the run's checkpoints and `--resume` (on top of `checkpoint.py`'s files),
`selection.py` the model that is exported.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from reagent_lite.config import WorkflowConfig
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.tensordict import TensorDict
from reagent_lite.distributed.context import DistContext
from reagent_lite.evaluation.cpe_models import CpeModelTrainer, CpeNets, EvaluatedPolicy
from reagent_lite.export import RunResult, write_outputs
from reagent_lite.io_utils import output_errors
from reagent_lite.kinds import EVAL_ONLY_FIELDS, FeatureSpace, Kind, get_kind
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.normalization.params import NormalizationParameters
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training import resuming
from reagent_lite.training.budget import check_fits
from reagent_lite.training.divergence import DivergenceCheck, q_bound
from reagent_lite.training.epoch_end import as_float, end_epoch
from reagent_lite.training.graphs import ddp_construction
from reagent_lite.training.host_memory import keep_freed_memory
from reagent_lite.training.metrics import MetricsWriter
from reagent_lite.training.ownership import begin_run, check_same_job
from reagent_lite.training.preemption import StopPoints, StopSignals
from reagent_lite.training.selection import ModelSelection
from reagent_lite.training.shard import load_training_shard
from reagent_lite.training.steps import StepRunner, build_step_runner, plan_steps
from reagent_lite.training.tracking import MlflowTracker
from reagent_lite.training.verify import check_replicas, replica_digest, verify_every

log = logging.getLogger("reagent_lite")


class Workflow:
    # Set by load_training_data().
    space: FeatureSpace
    norm: dict[str, dict[str, NormalizationParameters]]
    pre: dict[str, Preprocessor]
    train_data: TensorDict
    ingest_timings: dict[str, float]

    def __init__(
        self,
        kind: str | Kind[Any],
        cfg: WorkflowConfig,
        ctx: DistContext,
        *,
        resume: bool = False,
        stop: StopSignals | None = None,
    ):
        self.kind: Kind[Any] = get_kind(kind) if isinstance(kind, str) else kind
        self.cfg = cfg
        self.ctx = ctx
        self.resume = resume
        self.output_dir = Path(cfg.model_output_path)
        self.device = ctx.device
        self.metrics: MetricsWriter | None = None
        self.start_epoch = 0
        self.global_step = 0
        self.selection = ModelSelection(cfg.evaluation.model_selection)
        self.cpe_policy = EvaluatedPolicy(cfg.evaluation.policy, cfg.rl.temperature)
        self.history: list[dict[str, Any]] = []
        self._runner: StepRunner | None = None
        # Debug switches (training/verify.py); read once so the hot loop only tests an int.
        self.verify_every = verify_every()
        self.replica_checks = 0
        self.emulated_shards: list[int] | None = None
        # stream_from_disk: the shard's reader; `train_data` is then only a normalized sample.
        self.disk: DiskShardStream | None = None
        # Preemption: the signals this rank received, when to checkpoint mid-epoch, and
        # where a run resumed from a mid-epoch checkpoint continues.
        self.stop = stop or StopSignals()
        self.stop_points = StopPoints(
            ctx,
            self.stop,
            every_steps=cfg.checkpoint_every_steps,
            every_minutes=cfg.checkpoint_every_minutes,
            check_every_steps=cfg.stop_check_every_steps,
        )
        self._position: dict[str, Any] | None = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        check_same_job(ctx, cfg.model_dump(mode="json"), self.resume)
        torch.manual_seed(cfg.seed)
        self.load_training_data()
        if cfg.device_resident_data:
            self.train_data = self.train_data.to(self.device)
        if self.device.type == "cpu" and self.disk is None:
            # One gather per minibatch for all float columns (`RowPack`); on CUDA the
            # gathers are inside the step's graph and the columns stay apart.
            self.train_data = self.train_data.packed(skip=EVAL_ONLY_FIELDS, consume=True)
        self.eval_data = self._eval_tensors() if ctx.is_rank_zero else None
        dims = {name: p.out_dim for name, p in self.pre.items()}
        check_fits(cfg, sum(dims.values()), self.space, self.device)
        self.q_net = self.kind.build_policy_network(cfg, dims, self.space).to(self.device)
        ckpt.warm_start(self.q_net, cfg.training.warm_start_model_path)
        self.q_net_ddp = self._wrap(self.q_net)
        self.trainer = self.kind.build_trainer(self.q_net_ddp, cfg, self.space, self.q_net)
        if cfg.training.scale_lr_with_world_size:
            for group in self.trainer.optimizer.param_groups:
                group["lr"] *= ctx.world_size
        self.cpe: CpeModelTrainer | None = None
        if cfg.evaluation.calc_cpe_in_training:
            nets = CpeNets(
                self.kind.build_q_network(cfg, dims, self.space),
                self.kind.build_q_network(cfg, dims, self.space),
            ).to(self.device)
            self.cpe_nets = nets
            self.cpe = CpeModelTrainer(
                self.kind,
                # DataParallel cannot scatter the batch object CpeNets takes (each replica
                # would read cuda:0 tensors): only DDP wraps the small side models.
                self._wrap(nets, data_parallel=False),
                gamma=cfg.rl.gamma,
                policy=self.cpe_policy,
                target_update_rate=cfg.rl.target_update_rate,
                learning_rate=cfg.training.learning_rate,
                use_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            )
        self._plan_steps()
        if self.device.type == "cpu":
            # Step after step the same large activations: their pages kept, not re-faulted.
            how = keep_freed_memory()
            if ctx.is_rank_zero:
                log.info("host memory: %s", how)
        # Every rank knows the run (restore checks the checkpoint's); only rank 0 records it.
        self.run_id = ctx.broadcast_object(
            begin_run(self.output_dir, resume=self.resume) if ctx.is_rank_zero else None
        )
        if ctx.is_rank_zero:
            self.metrics = MetricsWriter(
                self.output_dir,
                append=self.resume,
                tensorboard=cfg.tensorboard,
                tracker=MlflowTracker(cfg.mlflow, cfg) if cfg.mlflow is not None else None,
            )
        self.divergence = DivergenceCheck(q_bound(self))
        if self.resume:
            resuming.restore(self)

    def load_training_data(self) -> None:
        """Reads, validates, tensorizes and normalizes this rank's training shard on the CPU
        into `space`, `norm`, `pre` and `train_data` (and `disk` under `stream_from_disk`);
        `ingest_timings` says where the time went (seconds). `benchmarks/bench_ingest.py`
        measures this very method."""
        shard = load_training_shard(self.kind, self.cfg, self.ctx)
        self.space, self.norm, self.pre = shard.space, shard.norm, shard.pre
        self.train_data, self.ingest_timings = shard.train_data, shard.timings
        self.emulated_shards, self.disk = shard.emulated_shards, shard.disk

    def _eval_tensors(self) -> TensorDict | None:
        path = self.cfg.eval_data_path
        if not path:
            return None
        # The training run's feature space and normalization, through the same ingest.
        raw = self.kind.load_table(self.cfg, self.space, path)
        return self.kind.training_tensors(raw, self.pre).to(self.device)

    def _wrap(self, module: nn.Module, *, data_parallel: bool = True) -> nn.Module:
        if self.ctx.world_size > 1:
            # Several processes (also `dp` under torchrun): only DDP keeps them in sync.
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            # On the stream the step will be captured on (graphs.py's notes say why).
            with ddp_construction(self.device, self.cfg.cuda_graphs):
                return nn.parallel.DistributedDataParallel(module, device_ids=device_ids)
        if (
            data_parallel
            and self.cfg.data_parallel == "dp"
            and self.device.type == "cuda"
            and torch.cuda.device_count() > 1
        ):
            return nn.DataParallel(module)
        return module

    def _plan_steps(self) -> None:
        local = self.disk.num_rows if self.disk is not None else len(self.train_data)
        self.steps_per_epoch, self.sampler = plan_steps(
            self.cfg, self.ctx, local, self.emulated_shards
        )

    # ------------------------------------------------------------------ train
    def step_runner(self) -> StepRunner:
        """The object that runs this rank's optimizer steps (built once, after setup)."""
        if self._runner is None:
            cfg = self.cfg
            if self.disk is not None:
                self.disk.configure(
                    step_rows=self.sampler.batch_size * cfg.training.minibatches_per_step,
                    steps_per_epoch=self.steps_per_epoch,
                )
            self._runner = build_step_runner(
                trainer=self.trainer,
                cpe=self.cpe,
                ctx=self.ctx,
                data=self.train_data,
                sampler=self.sampler,
                steps_per_epoch=self.steps_per_epoch,
                minibatches_per_step=cfg.training.minibatches_per_step,
                # The sampler's batch: micro-batch size, or W of them when emulating W ranks.
                minibatch_size=self.sampler.batch_size,
                cuda_graphs=cfg.cuda_graphs,
                resident=cfg.device_resident_data,
                precision=cfg.training.precision,
                compiled=cfg.training.compile,
                step_variants=cfg.training.step_variants,
                disk=self.disk,
                epochs=cfg.epochs,
            )
        return self._runner

    def train(self) -> None:
        with self._output_errors():
            self._train()

    def _output_errors(self) -> Any:
        return output_errors(self.output_dir, lambda: ckpt.latest_checkpoint(self.output_dir))

    def _train(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        runner = self.step_runner()
        self.stop.deferring = True  # from here a signal stops at a step, with a checkpoint
        for epoch in range(self.start_epoch, cfg.epochs):
            # Dropout and other randomness: a pure function of (seed, epoch, rank), so a
            # resumed run draws exactly what an uninterrupted one would.
            torch.manual_seed(cfg.seed * 1_000_003 + epoch * 7919 + ctx.rank)
            self.q_net_ddp.train()
            # Sets the epoch's batch stream (and, the first time on CUDA, captures the step).
            runner.begin_epoch(epoch)
            first = 0
            if self._position is not None:  # resumed mid-epoch
                first = self.stop_points.resume(self._position, runner)
                self._position = None
            if epoch == self.start_epoch and ctx.is_rank_zero:
                log.info("%s", runner.describe())
            bar = tqdm(
                initial=first,
                total=self.steps_per_epoch,
                desc=f"epoch {epoch + 1}/{cfg.epochs}",
                # `\r` frames only on a terminal; in a file (Slurm, CI) the log lines below.
                disable=not (ctx.is_rank_zero and _stderr_is_terminal()),
                mininterval=1.0,
                leave=False,
            )
            if ctx.is_rank_zero and bar.disable:
                log.info(
                    "epoch %d/%d: %d optimizer steps", epoch + 1, cfg.epochs, self.steps_per_epoch
                )
            self._sync()
            # All ranks start the clock together: otherwise the others' first all-reduce
            # waits out rank 0's evaluation of the last epoch, counted as their training time.
            ctx.barrier()
            start = time.perf_counter()
            # The hot path: no host sync per step (the bar is host-only; logging every
            # `log_every_steps` reads the loss, which is the one sync).
            for step in range(first, self.steps_per_epoch):
                runner.step()
                self.global_step += 1
                if self.verify_every and self.global_step % self.verify_every == 0:
                    self._check_replicas()
                bar.update(1)
                if cfg.log_every_steps and (step + 1) % cfg.log_every_steps == 0:
                    loss = self._log_step(epoch, runner.loss_sum / (step + 1))
                    if bar.disable:
                        log.info(
                            "epoch %d/%d step %d/%d: running loss %.6g",
                            epoch + 1,
                            cfg.epochs,
                            step + 1,
                            self.steps_per_epoch,
                            loss,
                        )
                    else:
                        bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
                resuming.poll(self, epoch, step + 1, runner)
            bar.close()
            self._sync()
            elapsed = time.perf_counter() - start
            end_epoch(self, epoch, runner.loss_sum, elapsed)
        if self.verify_every:
            self._check_replicas()
            if ctx.is_rank_zero:
                log.info(
                    "replica check: all %d ranks held identical parameters at %d checks "
                    "(every %d steps, last after step %d)",
                    ctx.world_size,
                    self.replica_checks,
                    self.verify_every,
                    self.global_step,
                )
        ctx.barrier()

    def _check_replicas(self) -> None:
        check_replicas(self.ctx, self.global_step, replica_digest(self.q_net, self.trainer.target))
        self.replica_checks += 1

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _log_step(self, epoch: int, mean_loss: Tensor) -> float:
        """The epoch's running loss so far (global), also written to metrics.jsonl."""
        loss = as_float(self.ctx.all_reduce_mean(mean_loss.detach().clone()))
        if self.metrics is not None:
            self.metrics.write({"epoch": epoch, "steps": self.global_step, "loss": loss})
        return loss

    # ------------------------------------------------------------------- save
    def final_model(self) -> nn.Module:
        return self.selection.model(self.q_net)

    def result(self) -> RunResult:
        """The finished run as export reads it (rank 0)."""
        return RunResult(
            kind=self.kind,
            cfg=self.cfg,
            space=self.space,
            norm=self.norm,
            pre=self.pre,
            q_net=self.final_model(),
            selected_epoch=self.selection.epoch,
            history=tuple(self.history),
            world_size=self.ctx.world_size,
            run_id=self.run_id,
        )

    def save(self) -> Path | None:
        if not self.ctx.is_rank_zero:
            return None
        with self._output_errors():
            model_path, online = write_outputs(self.result())
            if online is not None and self.metrics is not None:
                self.metrics.write(
                    {"epoch": self.selection.epoch, "steps": self.global_step, "online": online}
                )
            if self.metrics is not None:
                self.metrics.outputs_written()
        return model_path

    def cleanup(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self._runner is not None:
            # A stream left open by an error: stop its worker first; and the graph goes
            # before the process group does (NCCL waits for graphs holding its collectives).
            self._runner.release()
            self._runner = None
        if self.disk is not None:
            self.disk.close()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
