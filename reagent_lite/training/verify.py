"""Debug switches that check the distributed contract; both cost nothing when unset.

* ``REAGENT_LITE_VERIFY_REPLICAS=N``: every N optimizer steps, and once after the last one,
  every rank hashes the bytes of its Q-network and target network and the hashes are
  all-gathered; ranks that disagree (or that ran a different number of steps) stop the job
  with `DistributedError`. Rank 0 logs how many checks passed. DDP keeps replicas
  bit-identical, so any difference is a bug (a rank-dependent update, a missed all-reduce).
* ``REAGENT_LITE_EMULATE_WORLD_SIZE=W`` (single-process runs only): read the W shards a
  W-rank job would read, laid end to end in rank order, and train on batches that are the
  union of what the W ranks would draw (`UnionSampler`). With `minibatch_size` B this is
  the single-process run with global batch W·B over the same data order that a W-rank DDP
  job must match to within float tolerance.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

import torch
from torch import nn

from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError, DistributedError

VERIFY_ENV = "REAGENT_LITE_VERIFY_REPLICAS"
EMULATE_ENV = "REAGENT_LITE_EMULATE_WORLD_SIZE"


def _positive_int(name: str, env: Mapping[str, str]) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"environment variable {name} must be an integer >= 1 (got {raw!r})")
    return value


def verify_every(env: Mapping[str, str] | None = None) -> int:
    """Steps between replica checks; 0 = off."""
    return _positive_int(VERIFY_ENV, os.environ if env is None else env) or 0


def emulated_world_size(world_size: int, env: Mapping[str, str] | None = None) -> int | None:
    """W to emulate in this single process, or None."""
    w = _positive_int(EMULATE_ENV, os.environ if env is None else env)
    if w is not None and world_size != 1:
        raise ConfigError(
            f"{EMULATE_ENV}={w} emulates a multi-process job in one process, but this job "
            f"already has world size {world_size}; unset it"
        )
    return w


def replica_digest(*modules: nn.Module) -> str:
    """SHA-256 of the names and raw bytes of every tensor in the modules' state dicts."""
    h = hashlib.sha256()
    for module in modules:
        for name, tensor in module.state_dict().items():
            h.update(name.encode())
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_replicas(ctx: DistContext, step: int, digest: str) -> None:
    """All-gathers (step, digest); raises `DistributedError` on every rank if any differ."""
    seen = ctx.all_gather_object((step, digest))
    if len(set(seen)) <= 1:
        return
    detail = "; ".join(f"rank {r}: step {s}, digest {d[:12]}" for r, (s, d) in enumerate(seen))
    raise DistributedError(
        f"replica check failed after optimizer step {step} on rank {ctx.rank}: the ranks no "
        f"longer hold identical parameters or ran different step counts ({detail})"
    )
