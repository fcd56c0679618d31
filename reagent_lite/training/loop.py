"""The one training loop both workflows share: setup / train / save / cleanup.

A `Workflow` runs inside every rank. `setup` reads the data and builds what the run is
made of — the networks, the trainer, the CPE models, the step runner — into a frozen
`run.Run`; `train_epochs` is the loop itself, reading top to bottom: each epoch's steps,
then `epoch_end.end_epoch`, carrying a `state.TrainState` from epoch to epoch (`resuming`
gives the first one on `--resume` and writes the mid-epoch checkpoints). The Workflow asks
its `DistContext` only for collectives and for `is_rank_zero`; the kind (dqn or
parametric_dqn) supplies tensors and networks, `selection.py` the model that is exported.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reagent_lite.config import WorkflowConfig
from reagent_lite.config.models import StepPlanParameters
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.rows import Rows
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import TrainingError
from reagent_lite.evaluation.cpe_models import CpeModelTrainer, CpeNets, EvaluatedPolicy
from reagent_lite.export import RunResult, write_outputs
from reagent_lite.io_utils import output_errors
from reagent_lite.kinds import EVAL_ONLY_FIELDS, FeatureSpace, Kind, get_kind
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.normalization.params import NormalizationParameters
from reagent_lite.trainers.common import QLearningTrainer
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training import resuming
from reagent_lite.training.budget import check_fits
from reagent_lite.training.divergence import REMEDIES, ended_diverged, probe_rows, q_bound
from reagent_lite.training.epochs import train_epochs
from reagent_lite.training.graphs import ddp_construction
from reagent_lite.training.host_memory import HostMemory, keep_freed_memory
from reagent_lite.training.inputs import Fingerprint, fingerprint
from reagent_lite.training.metrics import MetricsWriter
from reagent_lite.training.ownership import begin_run, check_same_job
from reagent_lite.training.preemption import StopPoints, StopSignals
from reagent_lite.training.run import Run
from reagent_lite.training.selection import selected_model
from reagent_lite.training.shard import load_training_shard
from reagent_lite.training.state import EpochRecord, TrainState
from reagent_lite.training.step_plan import StepShape, asked, step_shape
from reagent_lite.training.steps import StepRunner, build_step_runner, plan_steps
from reagent_lite.training.tracking import MlflowTracker

log = logging.getLogger("reagent_lite")


class Workflow:
    # Set by load_training_data().
    space: FeatureSpace
    norm: dict[str, dict[str, NormalizationParameters]]
    pre: dict[str, Preprocessor]
    train_data: Rows
    ingest_timings: dict[str, float]
    # Set by setup().
    run: Run
    q_net_ddp: nn.Module
    steps_per_epoch: int
    host_memory: HostMemory
    step_plan: StepPlanParameters
    step_shape: StepShape

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
        # Where the run stands between epochs; `train` replaces it as epochs end.
        self.state = TrainState()
        self.start_epoch = 0  # the epoch this process started training at
        self._runner: StepRunner | None = None
        self.emulated_shards: list[int] | None = None
        # stream_from_disk: the shard's reader; `train_data` is then only a normalized sample.
        self.disk: DiskShardStream | None = None
        # Preemption: the signals this rank received, and when to checkpoint mid-epoch.
        self.stop = stop or StopSignals()
        self.stop_points = StopPoints(
            ctx,
            self.stop,
            every_steps=cfg.checkpoint_every_steps,
            every_minutes=cfg.checkpoint_every_minutes,
            check_every_steps=cfg.stop_check_every_steps,
        )

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        check_same_job(ctx, cfg.model_dump(mode="json"), self.resume)
        # The run is recorded before any work: a fresh run that dies while loading its
        # data must not leave run.json naming an earlier run for the next --resume. And
        # what it trains on, as found before reading it (checkpoints keep it: inputs.py).
        begun: tuple[str, Fingerprint] = ctx.broadcast_object(
            (begin_run(self.output_dir, resume=self.resume), fingerprint(cfg))
            if ctx.is_rank_zero
            else None
        )
        run_id, inputs = begun
        torch.manual_seed(cfg.seed)
        self.load_training_data()
        if cfg.device_resident_data:
            self.train_data = self.train_data.to(self.device)
        if self.device.type == "cpu" and self.disk is None:
            # One gather per minibatch for all float columns (`RowPack`); on CUDA the
            # gathers are inside the step's graph and the columns stay apart.
            self.train_data = self.train_data.packed(skip=EVAL_ONLY_FIELDS, consume=True)
        eval_data = self._eval_tensors() if ctx.is_rank_zero else None
        dims = {name: p.out_dim for name, p in self.pre.items()}
        check_fits(cfg, sum(dims.values()), self.space, self.device)
        q_net = self.kind.build_policy_network(cfg, dims, self.space).to(self.device)
        ckpt.warm_start(q_net, cfg.training.warm_start_model_path)
        self.q_net_ddp = self._wrap(q_net)
        # What the step is built for, before any optimizer: they are built as it needs.
        self.step_shape = step_shape(
            self.device,
            cuda_graphs=cfg.cuda_graphs,
            compile=cfg.training.compile,
            world_size=ctx.world_size,
            backend=ctx.backend,
            optimizer=cfg.training.optimizer,
            data_parallel=isinstance(self.q_net_ddp, nn.DataParallel),
        )
        trainer = self.kind.build_trainer(self.q_net_ddp, cfg, self.space, q_net)
        lr_scale = ctx.world_size if cfg.training.scale_lr_with_world_size else 1
        trainer.build_optimizer(self.step_shape.kernel, lr_scale=lr_scale)
        policy = EvaluatedPolicy(cfg.evaluation.policy, cfg.rl.temperature)
        cpe_nets, cpe = self._cpe_models(dims, policy)
        self._plan_steps()
        # The step plan's asks, the deprecated environment switches mapped on (once).
        self.step_plan = asked(cfg.training.step_plan, warn=ctx.is_rank_zero)
        # Step after step the same large activations: their pages kept, not re-faulted.
        self.host_memory = keep_freed_memory(
            self.step_plan.keep_freed_memory, cuda=self.device.type == "cuda"
        )
        if ctx.is_rank_zero and (self.device.type == "cpu" or self.host_memory.kept):
            log.info("host memory: %s", self.host_memory.how)
        metrics = None
        if ctx.is_rank_zero:
            metrics = MetricsWriter(
                self.output_dir,
                append=self.resume,
                tensorboard=cfg.tensorboard,
                tracker=MlflowTracker(cfg.mlflow, cfg) if cfg.mlflow is not None else None,
            )
        self.run = Run(
            kind=self.kind,
            cfg=cfg,
            ctx=ctx,
            run_id=run_id,
            inputs=inputs,
            output_dir=self.output_dir,
            space=self.space,
            q_net=q_net,
            trainer=trainer,
            cpe=cpe,
            cpe_nets=cpe_nets,
            cpe_policy=policy,
            eval_data=eval_data,
            probe=probe_rows(eval_data if eval_data is not None else self.train_data, self.device),
            q_bound=q_bound(ctx, self.train_data.reward, cfg.rl),
            metrics=metrics,
        )
        self.state = resuming.restore(self.run) if self.resume else TrainState()
        self.start_epoch = self.state.epoch

    def load_training_data(self) -> None:
        """Reads, validates, tensorizes and normalizes this rank's training shard on the CPU
        into `space`, `norm`, `pre` and `train_data` (and `disk` under `stream_from_disk`);
        `ingest_timings` says where the time went (seconds). `benchmarks/bench_ingest.py`
        measures this very method."""
        shard = load_training_shard(self.kind, self.cfg, self.ctx)
        self.space, self.norm, self.pre = shard.space, shard.norm, shard.pre
        self.train_data, self.ingest_timings = shard.train_data, shard.timings
        self.emulated_shards, self.disk = shard.emulated_shards, shard.disk

    def _eval_tensors(self) -> Rows | None:
        path = self.cfg.eval_data_path
        if not path:
            return None
        # The training run's feature space and normalization, through the same ingest.
        raw = self.kind.load_table(self.cfg, self.space, path)
        return self.kind.training_tensors(raw, self.pre).to(self.device)

    def _cpe_models(
        self, dims: dict[str, int], policy: EvaluatedPolicy
    ) -> tuple[CpeNets | None, CpeModelTrainer | None]:
        cfg = self.cfg
        if not cfg.evaluation.calc_cpe_in_training:
            return None, None
        nets = CpeNets(
            self.kind.build_q_network(cfg, dims, self.space),
            self.kind.build_q_network(cfg, dims, self.space),
        ).to(self.device)
        cpe = CpeModelTrainer(
            self.kind,
            # DataParallel cannot scatter the batch object CpeNets takes (each replica
            # would read cuda:0 tensors): only DDP wraps the small side models.
            self._wrap(nets, data_parallel=False),
            gamma=cfg.rl.gamma,
            policy=policy,
            target_update_rate=cfg.rl.target_update_rate,
            learning_rate=cfg.training.learning_rate,
            use_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            optimizer_kernel=self.step_shape.kernel,
        )
        return nets, cpe

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

    # What setup built, by name (tests and benchmarks read these).
    @property
    def q_net(self) -> nn.Module:
        return self.run.q_net

    @property
    def trainer(self) -> QLearningTrainer[Any]:
        return self.run.trainer

    @property
    def cpe(self) -> CpeModelTrainer | None:
        return self.run.cpe

    @property
    def cpe_nets(self) -> CpeNets | None:
        return self.run.cpe_nets

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def history(self) -> list[EpochRecord]:
        return list(self.state.history)

    @property
    def global_step(self) -> int:
        return self.state.global_step

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
                trainer=self.run.trainer,
                cpe=self.run.cpe,
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
                step_plan=self.step_plan,
                host_memory=self.host_memory,
                disk=self.disk,
                epochs=cfg.epochs,
                shape=self.step_shape,
            )
        return self._runner

    def train(self) -> None:
        with self._output_errors():
            runner = self.step_runner()
            self.stop.deferring = True  # from here a signal stops at a step, with a checkpoint
            self.state = train_epochs(
                self.run,
                self.state,
                runner,
                self.stop_points,
                trained=self.q_net_ddp,
                steps_per_epoch=self.steps_per_epoch,
            )

    def _output_errors(self) -> Any:
        return output_errors(self.output_dir, lambda: ckpt.latest_checkpoint(self.output_dir))

    # ------------------------------------------------------------------- save
    def final_model(self) -> nn.Module:
        return selected_model(self.run.q_net, self.state.best)

    def result(self) -> RunResult:
        """The finished run as export reads it (rank 0)."""
        return RunResult(
            kind=self.kind,
            cfg=self.cfg,
            space=self.space,
            norm=self.norm,
            pre=self.pre,
            q_net=self.final_model(),
            selected_epoch=self.state.best.epoch,
            history=self.state.history,
            world_size=self.ctx.world_size,
            run_id=self.run.run_id,
        )

    def save(self) -> Path | None:
        self._refuse_diverged()
        if not self.ctx.is_rank_zero:
            return None
        metrics = self.run.metrics
        with self._output_errors():
            model_path, online = write_outputs(self.result())
            if online is not None and metrics is not None:
                metrics.write(
                    {"epoch": self.state.best.epoch, "steps": self.global_step, "online": online}
                )
            if metrics is not None:
                metrics.outputs_written()
        return model_path

    def _refuse_diverged(self) -> None:
        """A run that ends diverged exports nothing (divergence.py): every rank raises the
        same `TrainingError`, as rank 0 decides from its records."""
        why = ended_diverged(self.state) if self.ctx.is_rank_zero else None
        if why is not None and self.cfg.training.export_diverged_model:
            log.warning("training.export_diverged_model is on: writing model.pt2 although %s", why)
            why = None
        why = self.ctx.broadcast_object(why)
        if why is not None:
            refused = TrainingError(
                f"{why}. A policy read from such values is not to be trusted, so model.pt2 "
                f"was not written (the checkpoints are kept). Retrain with a remedy, "
                f"{REMEDIES}, or set training.export_diverged_model=true to export it anyway"
            )
            refused.agreed_by_all_ranks = True  # every rank stops here, after training
            raise refused

    def cleanup(self) -> None:
        run: Run | None = getattr(self, "run", None)  # None: setup did not get that far
        if run is not None and run.metrics is not None:
            run.metrics.close()
        if self._runner is not None:
            # A stream left open by an error: stop its worker first; and the graph goes
            # before the process group does (NCCL waits for graphs holding its collectives).
            self._runner.release()
            self._runner = None
        if self.disk is not None:
            self.disk.close()
