"""A run's checkpoints as the training loop writes and reads them: the state a checkpoint
holds (`checkpoint_state`), the mid-epoch checkpoint and the preemption stop after a step
(`poll`), and `--resume` (`restore`). Saving, finding and validating the files is
`checkpoint.py`'s; when to stop or checkpoint mid-epoch is `preemption.py`'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from reagent_lite.errors import ConfigError
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.preemption import stopped
from reagent_lite.training.steps import StepRunner

if TYPE_CHECKING:
    from reagent_lite.training.loop import Workflow

log = logging.getLogger("reagent_lite")


def checkpoint_state(wf: Workflow, epoch: int) -> dict[str, Any]:
    return ckpt.run_state(
        epoch=epoch,
        global_step=wf.global_step,
        q_net=wf.q_net,
        trainer=wf.trainer,
        cpe=wf.cpe,
        best=wf.selection.best,
        history=wf.history,
        space=wf.space.to_json(),
        run_id=wf.run_id,
        config=wf.cfg.model_dump(mode="json"),
    )


def poll(wf: Workflow, epoch: int, done: int, runner: StepRunner) -> None:
    """After step `done` of `epoch`: a mid-epoch checkpoint when one is due, and a stop
    (`Preempted`) when any rank received SIGTERM/SIGINT (preemption.py)."""
    due, signum = wf.stop_points.poll(done, wf.global_step, runner.control_stream)
    if not (due or signum):
        return
    ranks = wf.stop_points.ranks_state(runner)
    path = None
    if wf.ctx.is_rank_zero:
        state = checkpoint_state(wf, epoch)
        state["position"] = {
            "steps_done": done,
            "world_size": wf.ctx.world_size,
            "ranks": ranks,
        }
        path = ckpt.save_checkpoint(wf.output_dir, wf.run_id, epoch, state, step=done)
        wf.stop_points.cadence.written()
        log.info("mid-epoch checkpoint %s", path)
    if signum:
        raise stopped(signum, epoch, done, wf.global_step, path)


def restore(wf: Workflow) -> None:
    found = ckpt.restore(
        wf.ctx,
        wf.output_dir,
        run_id=wf.run_id,
        config=wf.cfg.model_dump(mode="json"),
        space=wf.space.to_json(),
        q_net=wf.q_net,
        trainer=wf.trainer,
        cpe=wf.cpe,
    )
    if found is None:
        if wf.ctx.is_rank_zero:
            log.warning("--resume: no checkpoint under %s; starting from scratch", wf.output_dir)
        if wf.metrics is not None:
            wf.metrics.drop_after(-1)
        return
    resumed, state = found
    wf.selection.best = resumed.best
    wf.history = resumed.history
    wf.start_epoch = resumed.epoch + 1
    wf.global_step = resumed.global_step
    position = state.get("position")
    if position is not None:  # mid-epoch: the same epoch goes on after its last step
        if position["world_size"] != wf.ctx.world_size:
            raise ConfigError(
                f"--resume: checkpoint {resumed.path} was written mid-epoch by "
                f"{position['world_size']} ranks; this run has {wf.ctx.world_size} "
                "(each rank's batch stream depends on it): resume with the same layout"
            )
        wf._position = position
        wf.start_epoch = resumed.epoch
    if wf.metrics is not None:
        # Records of the steps being redone (a crash mid-epoch, or after the last
        # checkpoint) would otherwise appear twice in metrics.jsonl and the report.
        wf.metrics.drop_after(resumed.epoch, steps=resumed.global_step)
    if wf.ctx.is_rank_zero:
        log.info("resumed from %s at epoch %d", resumed.path, wf.start_epoch + 1)
