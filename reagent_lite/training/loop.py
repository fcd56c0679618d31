"""The one training loop both workflows share: setup / train / save / cleanup.

A `Workflow` runs inside every rank. It asks its `DistContext` only for collectives and
for `is_rank_zero`; the kind (dqn or parametric_dqn) supplies tensors and networks.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from reagent_lite.data.readers import read_shard
from reagent_lite.data.sampler import EpochSampler
from reagent_lite.data.validate import validate
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError, TrainingError
from reagent_lite.evaluation.cpe_models import CpeModelTrainer, CpeNets
from reagent_lite.evaluation.evaluator import evaluate_cpe
from reagent_lite.normalization.identify import fit_normalization
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.normalization.params import NormalizationParameters, load_normalization
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.kinds import KINDS, FeatureSpace
from reagent_lite.training.metrics import MetricsWriter
from reagent_lite.training.tensordict import TensorDict

log = logging.getLogger("reagent_lite")


def _float(t: Tensor | float) -> float:
    return float(t.item()) if isinstance(t, Tensor) else float(t)


class Workflow:
    def __init__(self, kind_name: str, cfg: Any, ctx: DistContext, *, resume: bool = False):
        self.kind = KINDS[kind_name]
        self.cfg = cfg
        self.ctx = ctx
        self.resume = resume
        self.output_dir = Path(cfg.model_output_path)
        self.device = ctx.device
        self.metrics: MetricsWriter | None = None
        self.start_epoch = 0
        self.global_step = 0
        self.best: dict[str, Any] = {"epoch": -1, "score": math.inf, "state": None}
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        torch.manual_seed(cfg.seed)
        table = self._read(cfg.training_data_path, ctx.rank, ctx.world_size)
        self.space: FeatureSpace = self.kind.feature_space(ctx, table, cfg)
        raw = self.kind.tensorize(table, self.space, cfg)
        del table
        self.norm = self._normalization(raw)
        self.pre = {
            name: Preprocessor(self._ids(name), params) for name, params in self.norm.items()
        }
        self.train_data = self.kind.training_tensors(raw, self.pre)
        del raw
        if cfg.device_resident_data:
            self.train_data = self.train_data.to(self.device)
        self.eval_data = self._eval_tensors() if ctx.is_rank_zero else None
        dims = {name: p.out_dim for name, p in self.pre.items()}
        self.q_net = self.kind.build_q_network(cfg, dims, self.space).to(self.device)
        self._warm_start()
        self.q_net_ddp = self._wrap(self.q_net)
        self.trainer = self.kind.build_trainer(self.q_net_ddp, cfg, self.q_net)
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
                self._wrap(nets),
                gamma=cfg.rl.gamma,
                temperature=cfg.rl.temperature,
                target_update_rate=cfg.rl.target_update_rate,
                learning_rate=cfg.training.learning_rate,
                use_time_diff=cfg.rl.use_seq_num_diff_as_time_diff,
            )
        self._plan_steps()
        if ctx.is_rank_zero:
            self.metrics = MetricsWriter(self.output_dir, append=self.resume)
        if self.resume:
            self._restore()

    def _ids(self, name: str) -> list[str]:
        return self.space.state_ids if name == "state" else self.space.action_ids

    def _read(self, path: str, rank: int, world: int) -> Any:
        table = read_shard(path, rank, world)
        table, _report = validate(
            table,
            self.kind.name,  # type: ignore[arg-type]
            actions=getattr(self.cfg, "actions", None),
            source=str(path),
            drop_bad_rows=self.cfg.drop_bad_rows,
        )
        return table

    def _normalization(self, raw: Any) -> dict[str, dict[str, NormalizationParameters]]:
        """Loads the configured normalization, or fits it from a sample of every shard."""
        cfg, ctx = self.cfg, self.ctx
        given = {"state": cfg.state_norm_data_path}
        if self.kind.name == "parametric_dqn":
            given["action"] = cfg.action_norm_data_path
        norm: dict[str, dict[str, NormalizationParameters]] = {}
        per_rank = max(1, cfg.normalization_sample_size // ctx.world_size)
        samples = self.kind.norm_samples(raw, per_rank, cfg.seed + ctx.rank)
        for name, path in given.items():
            if path:
                norm[name] = load_normalization(Path(path))
                missing = [f for f in self._ids(name) if f not in norm[name]]
                if missing:
                    raise ConfigError(
                        f"{name}_norm_data_path: {path} has no parameters for feature ids "
                        f"{missing[:10]} found in the training data"
                    )
                continue
            # Every rank contributes its sample; rank 0 fits and broadcasts, so all ranks
            # hold bit-identical parameters whatever their shards.
            gathered = ctx.all_gather_object(samples[name])
            fitted = None
            if ctx.is_rank_zero:
                fitted = fit_normalization(
                    np.concatenate(gathered, axis=0),
                    self._ids(name),
                    action=(name == "action"),
                )
            norm[name] = ctx.broadcast_object(fitted)
        return norm

    def _eval_tensors(self) -> TensorDict | None:
        path = self.cfg.eval_data_path
        if not path:
            return None
        table = self._read(path, 0, 1)
        raw = self.kind.tensorize(table, self.space, self.cfg)
        return self.kind.training_tensors(raw, self.pre).to(self.device)

    def _warm_start(self) -> None:
        path = self.cfg.training.warm_start_model_path
        if not path:
            return
        file = Path(path)
        if file.is_dir():
            file = file / "model_state.pt"
        if not file.is_file():
            raise ConfigError(
                f"training.warm_start_model_path: no model state at '{file}' "
                "(expected a previous run's output directory or its model_state.pt)"
            )
        state = torch.load(file, map_location="cpu", weights_only=False)
        try:
            self.q_net.load_state_dict(state["q_net"])
        except RuntimeError as err:
            raise ConfigError(
                f"training.warm_start_model_path: '{file}' does not fit this network "
                f"(layers/features differ): {str(err).splitlines()[0]}"
            ) from err
        log.info("warm-started the Q-network from %s", file)

    def _wrap(self, module: nn.Module) -> nn.Module:
        if self.ctx.world_size > 1 and self.cfg.data_parallel == "ddp":
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(module, device_ids=device_ids)
        if self.cfg.data_parallel == "dp" and torch.cuda.device_count() > 1:
            return nn.DataParallel(module)
        return module

    def _plan_steps(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        micro, mps = cfg.training.minibatch_size, cfg.training.minibatches_per_step
        sizes = ctx.all_gather_object(len(self.train_data))
        self.steps_per_epoch = cfg.training.steps_per_epoch or max(
            1, math.ceil(max(sizes) / (micro * mps))
        )
        self.sampler = EpochSampler(
            len(self.train_data),
            micro,
            self.steps_per_epoch * mps,
            cfg.seed,
            ctx.rank,
            device=self.device if cfg.device_resident_data else "cpu",
        )
        if ctx.is_rank_zero:
            log.info(
                "world size %d, shard rows %s, global batch %d (%d per process × %d micro-batches), "
                "%d optimizer steps per epoch",
                ctx.world_size,
                sizes,
                micro * mps * ctx.world_size,
                micro,
                mps,
                self.steps_per_epoch,
            )

    # ------------------------------------------------------------------ train
    def train(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        mps = cfg.training.minibatches_per_step
        for epoch in range(self.start_epoch, cfg.epochs):
            # Dropout and other randomness: a pure function of (seed, epoch, rank), so a
            # resumed run draws exactly what an uninterrupted one would.
            torch.manual_seed(cfg.seed * 1_000_003 + epoch * 7919 + ctx.rank)
            self.q_net_ddp.train()
            loss_sum = torch.zeros((), device=self.device)
            self.sampler.set_epoch(epoch)
            indices = iter(self.sampler)
            bar = tqdm(
                total=self.steps_per_epoch,
                desc=f"epoch {epoch + 1}/{cfg.epochs}",
                disable=not ctx.is_rank_zero,
                mininterval=1.0,
                leave=False,
            )
            self._sync()
            start = time.perf_counter()
            for step in range(self.steps_per_epoch):
                batches = [self.train_data.index(next(indices)) for _ in range(mps)]
                if not cfg.device_resident_data:
                    batches = [b.to(self.device, non_blocking=True) for b in batches]
                record = self.trainer.train_step(batches)
                loss_sum += record.total
                if self.cpe is not None:
                    self.cpe.train_step(batches[0], self.q_net)
                self.global_step += 1
                bar.update(1)
                if cfg.log_every_steps and (step + 1) % cfg.log_every_steps == 0:
                    self._log_step(epoch, loss_sum / (step + 1))
            bar.close()
            self._sync()
            elapsed = time.perf_counter() - start
            self._end_epoch(epoch, loss_sum, elapsed)
        ctx.barrier()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _log_step(self, epoch: int, mean_loss: Tensor) -> None:
        loss = self.ctx.all_reduce_mean(mean_loss.detach().clone())
        if self.metrics is not None:
            self.metrics.write({"epoch": epoch, "steps": self.global_step, "loss": _float(loss)})

    def _end_epoch(self, epoch: int, loss_sum: Tensor, elapsed: float) -> None:
        cfg, ctx = self.cfg, self.ctx
        transitions = (
            self.steps_per_epoch * cfg.training.minibatch_size * cfg.training.minibatches_per_step
        )
        stats = torch.stack(
            [loss_sum.float(), torch.tensor(float(transitions), device=self.device)]
        )
        ctx.all_reduce_sum(stats)
        slowest = max(ctx.all_gather_object(elapsed))
        loss = _float(stats[0]) / (self.steps_per_epoch * ctx.world_size)
        if not math.isfinite(loss):
            # Every rank sees the same reduced loss, so every rank stops here together.
            last = ckpt.latest_checkpoint(self.output_dir)
            raise TrainingError(
                f"the training loss became {loss} in epoch {epoch + 1}; stopping. "
                f"Last good checkpoint: {last or 'none yet'}. Lower training.learning_rate, "
                "set training.clip_grad_norm, or check the rewards for extreme values."
            )
        self.trainer.on_epoch_end()
        record: dict[str, Any] = {
            "epoch": epoch,
            "steps": self.global_step,
            "loss": loss,
            "transitions_per_s": _float(stats[1]) / max(slowest, 1e-9),
            "learning_rate": self.trainer.optimizer.param_groups[0]["lr"],
            "world_size": ctx.world_size,
        }
        if ctx.is_rank_zero:
            record.update(self._evaluate(epoch))
            self._select(epoch, record)
            self.history.append(record)
            assert self.metrics is not None
            self.metrics.write(record)
            log.info(
                "epoch %d: loss %.5f, %.0f transitions/s%s",
                epoch + 1,
                loss,
                record["transitions_per_s"],
                f", eval TD {record['eval_td_loss']:.5f}" if "eval_td_loss" in record else "",
            )
            if cfg.checkpoint_every_epochs and (epoch + 1) % cfg.checkpoint_every_epochs == 0:
                ckpt.save_checkpoint(self.output_dir, epoch, self._checkpoint_state(epoch))

    def _evaluate(self, epoch: int) -> dict[str, Any]:
        if self.eval_data is None:
            return {}
        out: dict[str, Any] = {}
        # Only rank 0 evaluates: go around the DDP wrapper, whose forward may talk to peers.
        wrapped, self.trainer.q_net = self.trainer.q_net, self.q_net
        self.q_net.eval()
        try:
            with torch.no_grad():
                td = [self.trainer.compute_loss(c).td_loss for c in self.eval_data.chunks(65_536)]
        finally:
            self.q_net.train()
            self.trainer.q_net = wrapped
        out["eval_td_loss"] = float(torch.stack(td).mean().item())
        if self.cpe is not None:
            out["cpe"] = evaluate_cpe(
                self.kind,
                self.q_net,
                self.cpe_nets,
                self.eval_data,
                temperature=self.cfg.rl.temperature,
                gamma=self.cfg.rl.gamma,
                n_bootstrap=self.cfg.evaluation.bootstrap_samples,
                seed=self.cfg.seed + epoch,
            )
        return out

    def _select(self, epoch: int, record: dict[str, Any]) -> None:
        """Keeps the model the configured offline criterion prefers (lower score is better)."""
        criterion = self.cfg.evaluation.model_selection
        if criterion == "td_error" and "eval_td_loss" in record:
            score = record["eval_td_loss"]
        elif criterion == "cpe" and "cpe" in record:
            score = -record["cpe"]["doubly_robust"]["normalized"]
        else:
            score = -float(epoch)  # "last", or no eval data: the newest model wins
        if score <= self.best["score"] or not math.isfinite(self.best["score"]):
            self.best = {
                "epoch": epoch,
                "score": score,
                "state": {k: v.detach().cpu().clone() for k, v in self.q_net.state_dict().items()},
            }

    # ------------------------------------------------------------ checkpoints
    def _checkpoint_state(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "global_step": self.global_step,
            "q_net": self.q_net.state_dict(),
            "trainer": self.trainer.state_dict(),
            "cpe": self.cpe.state_dict() if self.cpe is not None else None,
            # The sampler's index stream is a pure function of (seed, rank, epoch): resuming
            # at the next epoch boundary needs nothing more than the epoch number.
            "best": self.best,
            "history": self.history,
            "space": self.space.to_json(),
        }

    def _restore(self) -> None:
        path = ckpt.latest_checkpoint(self.output_dir)
        if path is None:
            if self.ctx.is_rank_zero:
                log.warning(
                    "--resume: no checkpoint under %s; starting from scratch", self.output_dir
                )
            return
        state = ckpt.load_checkpoint(path)
        if state["space"] != self.space.to_json():
            raise ConfigError(
                f"--resume: checkpoint {path} was made for other features/actions than this data"
            )
        self.q_net.load_state_dict(state["q_net"])
        self.trainer.load_state_dict(state["trainer"])
        if self.cpe is not None and state["cpe"] is not None:
            self.cpe.load_state_dict(state["cpe"])
        self.best = state["best"]
        self.history = state["history"]
        self.start_epoch = state["epoch"] + 1
        self.global_step = state["global_step"]
        if self.ctx.is_rank_zero:
            log.info("resumed from %s at epoch %d", path, self.start_epoch + 1)

    # ------------------------------------------------------------------- save
    def final_model(self) -> nn.Module:
        net = copy.deepcopy(self.q_net).cpu()
        if self.best["state"] is not None:
            net.load_state_dict(self.best["state"])
        return net.eval()

    def save(self) -> Path | None:
        if not self.ctx.is_rank_zero:
            return None
        from reagent_lite.export import write_outputs

        return write_outputs(self)

    def cleanup(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
