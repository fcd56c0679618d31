"""The end of a training epoch: the loss reduced over the ranks (a non-finite one stops
every rank together), the epoch's record with rank 0's evaluation (eval TD loss, CPE, the
divergence check), model selection, metrics.jsonl and the epoch-cadence checkpoint.
`end_epoch` takes the run's state and returns the next one.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from reagent_lite.errors import TrainingError
from reagent_lite.evaluation.evaluator import evaluate_cpe
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.divergence import check_q_values
from reagent_lite.training.resuming import checkpoint_state
from reagent_lite.training.run import Run
from reagent_lite.training.selection import offer
from reagent_lite.training.state import EpochRecord, TrainState

log = logging.getLogger("reagent_lite")


def as_float(t: Tensor | float) -> float:
    """A device scalar or a number as a Python float (a host sync for a tensor)."""
    return float(t.item()) if isinstance(t, Tensor) else float(t)


def end_epoch(
    run: Run,
    state: TrainState,
    *,
    steps_per_epoch: int,
    steps_run: int | None = None,
    global_step: int,
    loss_sum: Tensor,
    elapsed: float,
    extra: EpochRecord | None = None,
) -> TrainState:
    """Epoch `state.epoch` has run its steps (`global_step` in all, `loss_sum` this rank's
    summed loss, in `elapsed` seconds): the state after it. `steps_run`: the steps this
    process ran and timed (fewer than `steps_per_epoch` in an epoch resumed mid-way; all of
    them when not given); `extra`: more fields for the record (the step plan)."""
    cfg, ctx, epoch = run.cfg, run.ctx, state.epoch
    # Throughput counts only the steps `elapsed` timed: a resumed epoch's earlier steps ran
    # (and were timed) before the stop.
    timed = steps_per_epoch if steps_run is None else steps_run
    transitions = timed * cfg.training.minibatch_size * cfg.training.minibatches_per_step
    stats = torch.stack(
        [loss_sum.float(), torch.tensor(float(transitions), device=loss_sum.device)]
    )
    ctx.all_reduce_sum(stats)
    # Each rank's time and its wait for streamed rows: the slowest time, the longest wait
    # (a rank short of data holds the others back at the next gradient sum).
    wait = (extra or {}).get("data_wait_s")
    gathered = ctx.all_gather_object((elapsed, wait))
    slowest = max(e for e, _ in gathered)
    loss = as_float(stats[0]) / (steps_per_epoch * ctx.world_size)
    if not math.isfinite(loss):
        # Every rank sees the same reduced loss, so every rank stops here together.
        last = ckpt.latest_checkpoint(run.output_dir, run.run_id)
        raise TrainingError(
            f"the training loss became {loss} in epoch {epoch + 1}; stopping. "
            f"Last good checkpoint: {last or 'none yet'}. Lower training.learning_rate, "
            "set training.clip_grad_norm, or check the rewards for extreme values."
        )
    run.trainer.on_epoch_end()
    record: EpochRecord = {
        "epoch": epoch,
        "steps": global_step,
        "loss": loss,
        "transitions_per_s": as_float(stats[1]) / max(slowest, 1e-9),
        "steps_timed": timed,
        "learning_rate": as_float(run.trainer.optimizer.param_groups[0]["lr"]),
        "world_size": ctx.world_size,
        **(extra or {}),
    }
    if wait is not None:
        record["data_wait_s"] = max(w for _, w in gathered if w is not None)
    if not ctx.is_rank_zero:
        return state.after_epoch(global_step, record, state.best)
    record.update(evaluate(run, epoch))
    record.update(
        check_q_values(
            run.kind,
            run.q_net,
            run.probe,
            run.q_bound,
            epoch,
            warned=state.diverged_at is not None,
        )
    )
    best = offer(cfg.evaluation.model_selection, state.best, epoch, record, run.q_net)
    after = state.after_epoch(global_step, record, best)
    assert run.metrics is not None
    run.metrics.write(record)
    log.info(
        "epoch %d: loss %.5f, %.0f transitions/s%s%s",
        epoch + 1,
        loss,
        record["transitions_per_s"],
        _waiting(record, elapsed),
        f", eval TD {record['eval_td_loss']:.5f}" if "eval_td_loss" in record else "",
    )
    if cfg.checkpoint_every_epochs and (epoch + 1) % cfg.checkpoint_every_epochs == 0:
        ckpt.save_checkpoint(run.output_dir, run.run_id, epoch, checkpoint_state(run, after, epoch))
    return after


def _waiting(record: EpochRecord, elapsed: float) -> str:
    """ ", N% of it waiting for data" where the step waited for streamed rows more than a
    twentieth of the epoch: the data, not the step, set its pace."""
    wait = record.get("data_wait_s")
    if wait is None or elapsed <= 0 or wait <= 0.05 * elapsed:
        return ""
    return f", {min(100.0, 100 * wait / elapsed):.0f}% of it waiting for data"


def evaluate(run: Run, epoch: int) -> EpochRecord:
    """Eval TD loss and CPE estimates of the current model (rank 0, plain modules)."""
    if run.eval_data is None:
        return {}
    out: EpochRecord = {}
    run.q_net.eval()
    try:
        td = [run.trainer.eval_td_loss(c) for c in run.eval_data.chunks(65_536)]
    finally:
        run.q_net.train()
    out["eval_td_loss"] = float(torch.stack(td).mean().item())
    if run.cpe is not None:
        assert run.cpe_nets is not None
        out["cpe"] = evaluate_cpe(
            run.kind,
            run.q_net,
            run.cpe_nets,
            run.eval_data,
            policy=run.cpe_policy,
            gamma=run.cfg.rl.gamma,
            n_bootstrap=run.cfg.evaluation.bootstrap_samples,
            seed=run.cfg.seed + epoch,
        )
    return out
