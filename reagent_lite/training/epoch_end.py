"""The end of a training epoch: the loss reduced over the ranks (a non-finite one stops
every rank together), the epoch's record with rank 0's evaluation (eval TD loss, CPE),
model selection, metrics.jsonl and the epoch-cadence checkpoint.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from reagent_lite.errors import TrainingError
from reagent_lite.evaluation.evaluator import evaluate_cpe
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.resuming import checkpoint_state

if TYPE_CHECKING:
    from reagent_lite.training.loop import Workflow

log = logging.getLogger("reagent_lite")


def as_float(t: Tensor | float) -> float:
    """A device scalar or a number as a Python float (a host sync for a tensor)."""
    return float(t.item()) if isinstance(t, Tensor) else float(t)


def end_epoch(wf: Workflow, epoch: int, loss_sum: Tensor, elapsed: float) -> None:
    cfg, ctx = wf.cfg, wf.ctx
    transitions = (
        wf.steps_per_epoch * cfg.training.minibatch_size * cfg.training.minibatches_per_step
    )
    stats = torch.stack([loss_sum.float(), torch.tensor(float(transitions), device=wf.device)])
    ctx.all_reduce_sum(stats)
    slowest = max(ctx.all_gather_object(elapsed))
    loss = as_float(stats[0]) / (wf.steps_per_epoch * ctx.world_size)
    if not math.isfinite(loss):
        # Every rank sees the same reduced loss, so every rank stops here together.
        last = ckpt.latest_checkpoint(wf.output_dir, wf.run_id)
        raise TrainingError(
            f"the training loss became {loss} in epoch {epoch + 1}; stopping. "
            f"Last good checkpoint: {last or 'none yet'}. Lower training.learning_rate, "
            "set training.clip_grad_norm, or check the rewards for extreme values."
        )
    wf.trainer.on_epoch_end()
    record: dict[str, Any] = {
        "epoch": epoch,
        "steps": wf.global_step,
        "loss": loss,
        "transitions_per_s": as_float(stats[1]) / max(slowest, 1e-9),
        "learning_rate": as_float(wf.trainer.optimizer.param_groups[0]["lr"]),
        "world_size": ctx.world_size,
    }
    if ctx.is_rank_zero:
        record.update(evaluate(wf, epoch))
        record.update(wf.divergence(wf, epoch))
        wf.selection.offer(epoch, record, wf.q_net)
        wf.history.append(record)
        assert wf.metrics is not None
        wf.metrics.write(record)
        log.info(
            "epoch %d: loss %.5f, %.0f transitions/s%s",
            epoch + 1,
            loss,
            record["transitions_per_s"],
            f", eval TD {record['eval_td_loss']:.5f}" if "eval_td_loss" in record else "",
        )
        if cfg.checkpoint_every_epochs and (epoch + 1) % cfg.checkpoint_every_epochs == 0:
            ckpt.save_checkpoint(wf.output_dir, wf.run_id, epoch, checkpoint_state(wf, epoch))


def evaluate(wf: Workflow, epoch: int) -> dict[str, Any]:
    """Eval TD loss and CPE estimates of the current model (rank 0, plain modules)."""
    if wf.eval_data is None:
        return {}
    out: dict[str, Any] = {}
    wf.q_net.eval()
    try:
        td = [wf.trainer.eval_td_loss(c) for c in wf.eval_data.chunks(65_536)]
    finally:
        wf.q_net.train()
    out["eval_td_loss"] = float(torch.stack(td).mean().item())
    if wf.cpe is not None:
        out["cpe"] = evaluate_cpe(
            wf.kind,
            wf.q_net,
            wf.cpe_nets,
            wf.eval_data,
            policy=wf.cpe_policy,
            gamma=wf.cfg.rl.gamma,
            n_bootstrap=wf.cfg.evaluation.bootstrap_samples,
            seed=wf.cfg.seed + epoch,
        )
    return out
