"""Loaded at start-up by every Python process of `test_launch.py`'s real-workflow failure
test (this directory goes first on PYTHONPATH, so the launcher and the ranks it spawns all
load it), and inert elsewhere (it acts only with `WATCH_DDP_DIR` set):

* every DDP wrapper writes ``<WATCH_DDP_DIR>/ddp_freed_rank<r>`` when it is freed: whether
  its process group still existed then;
* the rank `WATCH_DDP_FAIL_RANK` raises after `WATCH_DDP_FAIL_AFTER` training steps;
* the cycle collector is off, so only an explicit collection frees DDP's reference cycle.
"""

from __future__ import annotations

import os

if os.environ.get("WATCH_DDP_DIR"):
    import gc
    import weakref
    from pathlib import Path
    from typing import Any

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from reagent_lite.training.update import Update
    from tests.distributed._node import _note_freed

    _out = Path(os.environ["WATCH_DDP_DIR"])
    _ddp_init = DistributedDataParallel.__init__
    _train_step = Update.__call__
    _steps = [0]

    def _watched_init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        _ddp_init(self, *args, **kwargs)
        weakref.finalize(self, _note_freed, _out / f"ddp_freed_rank{dist.get_rank()}")

    def _failing_step(self: Update, *args: Any, **kwargs: Any) -> Any:
        _steps[0] += 1
        fail = int(os.environ.get("WATCH_DDP_FAIL_RANK", "-1"))
        after = int(os.environ.get("WATCH_DDP_FAIL_AFTER", "3"))
        if dist.is_initialized() and dist.get_rank() == fail and _steps[0] > after:
            raise ValueError("injected failure")
        return _train_step(self, *args, **kwargs)

    gc.disable()
    DistributedDataParallel.__init__ = _watched_init  # type: ignore[method-assign]
    Update.__call__ = _failing_step  # type: ignore[method-assign]
