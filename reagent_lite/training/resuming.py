"""A run's checkpoints as the training loop writes and reads them: the state a checkpoint
holds (`checkpoint_state`), the mid-epoch checkpoint and the preemption stop after a step
(`poll`), and `--resume` (`restore`, which hands back the `TrainState` to go on from).
Saving, finding and validating the files is `checkpoint.py`'s; when to stop or checkpoint
mid-epoch is `preemption.py`'s.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from reagent_lite.errors import ConfigError
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.preemption import StopPoints, stopped
from reagent_lite.training.run import Run
from reagent_lite.training.state import Best, TrainState
from reagent_lite.training.steps import StepRunner

log = logging.getLogger("reagent_lite")


def checkpoint_state(run: Run, state: TrainState, epoch: int) -> dict[str, Any]:
    """What a checkpoint after (part of) `epoch` holds, `state` being the run's then."""
    return ckpt.run_state(
        epoch=epoch,
        global_step=state.global_step,
        q_net=run.q_net,
        trainer=run.trainer,
        cpe=run.cpe,
        best=state.best.to_checkpoint(),
        history=list(state.history),
        space=run.space.to_json(),
        run_id=run.run_id,
        config=run.config_json,
        inputs=run.inputs,
    )


def poll(
    run: Run,
    stops: StopPoints,
    state: TrainState,
    done: int,
    global_step: int,
    runner: StepRunner,
) -> None:
    """After step `done` of epoch `state.epoch` (`global_step` in all): a mid-epoch
    checkpoint when one is due, and a stop (`Preempted`) when any rank received
    SIGTERM/SIGINT (preemption.py)."""
    due, signum = stops.poll(done, global_step)
    if not (due or signum):
        return
    ranks = stops.ranks_state(runner)
    path = None
    epoch = state.epoch
    if run.ctx.is_rank_zero:
        saved = checkpoint_state(run, replace(state, global_step=global_step), epoch)
        saved["position"] = {
            "steps_done": done,
            "world_size": run.ctx.world_size,
            "ranks": ranks,
        }
        path = ckpt.save_checkpoint(run.output_dir, run.run_id, epoch, saved, step=done)
        stops.cadence.written()
        log.info("mid-epoch checkpoint %s", path)
    if signum:
        raise stopped(signum, epoch, done, global_step, path)


def restore(run: Run) -> TrainState:
    """`--resume`: the networks, trainer and CPE models loaded from the run's newest
    checkpoint, and the state to go on from (a fresh one when there is none)."""
    found = ckpt.restore(
        run.ctx,
        run.output_dir,
        run_id=run.run_id,
        config=run.config_json,
        inputs=run.inputs,
        space=run.space.to_json(),
        q_net=run.q_net,
        trainer=run.trainer,
        cpe=run.cpe,
    )
    if found is None:
        if run.ctx.is_rank_zero:
            log.warning("--resume: no checkpoint under %s; starting from scratch", run.output_dir)
        if run.metrics is not None:
            run.metrics.drop_after(-1)
        return TrainState()
    resumed, saved = found
    position = saved.get("position")
    if position is not None and position["world_size"] != run.ctx.world_size:
        raise ConfigError(
            f"--resume: checkpoint {resumed.path} was written mid-epoch by "
            f"{position['world_size']} ranks; this run has {run.ctx.world_size} "
            "(each rank's batch stream depends on it): resume with the same layout"
        )
    state = TrainState(
        # Mid-epoch: the same epoch goes on after its last step.
        epoch=resumed.epoch if position is not None else resumed.epoch + 1,
        global_step=resumed.global_step,
        history=tuple(resumed.history),
        best=Best.from_checkpoint(resumed.best),
        position=position,
    )
    if run.metrics is not None:
        # Records of the steps being redone (a crash mid-epoch, or after the last
        # checkpoint) would otherwise appear twice in metrics.jsonl and the report.
        run.metrics.drop_after(resumed.epoch, steps=resumed.global_step)
    if run.ctx.is_rank_zero:
        log.info("resumed from %s at epoch %d", resumed.path, state.epoch + 1)
    return state
