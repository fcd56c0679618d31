"""Host memory between training steps: keep freed blocks for reuse (glibc malloc).

A CPU step allocates and frees the same large activations every step (a parametric step at
batch 1024 with 16 candidates: several [16384, 256] float tensors, 16 MiB each). glibc's
malloc adapts its thresholds to such sizes, but still hands the top of the heap back to the
kernel whenever more than twice the largest recent block is free there — so every step
the kernel zero-fills the same pages again: 16,000 page faults a step for the parametric
reference step on an Intel Xeon (`benchmarks/RESULTS.md`). PyTorch's CPU tuning notes
recommend jemalloc / tcmalloc for this; the same effect from glibc itself is two `mallopt`
settings:

* `M_MMAP_THRESHOLD` = 32 MiB (glibc's upper limit on 64-bit systems): blocks below come
  from the heap, where they can be reused, rather than from fresh `mmap`s;
* `M_TRIM_THRESHOLD` = 512 MiB: free memory at the heap's top is returned to the kernel
  only beyond that much.

The limit: a single activation of 32 MiB or more (e.g. parametric batch 2048 × 16
candidates × 256 units) is still a fresh `mmap` each time and faulted in every step; for
such runs preload jemalloc or tcmalloc (`LD_PRELOAD`), which this then leaves alone.

Set once per process, when a run's training is set up (after the shard is loaded, so
ingest's transient peaks are still returned; disk-streamed windows keep loading later,
under these settings), as `training.step_plan.keep_freed_memory` says: `auto` on CPU runs,
`on` on GPU runs too, `off` never. The cost: up to 512 MiB of freed heap per malloc arena
(in practice the main one) stays with the process for reuse; peak memory is unchanged.
Left alone, whatever the config, when an allocator is preloaded (`LD_PRELOAD` naming a
malloc), when the user set glibc's threshold tunables (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_`, or `glibc.malloc.*` in
`GLIBC_TUNABLES`), and outside glibc; with `on` a warning then says why.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from dataclasses import dataclass

from reagent_lite.config.models import Switch

log = logging.getLogger("reagent_lite")

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 512 * 2**20

KEY = "training.step_plan.keep_freed_memory"
_THRESHOLD_VARS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)

# What this process's malloc was given: set once, never undone (mallopt is process-wide).
_applied: str | None = None


@dataclass(frozen=True)
class HostMemory:
    """The step plan's choice: whether freed blocks are kept (`kept`) and how or why not
    (`how`, for the log line and the plan record)."""

    kept: bool
    how: str

    def plan(self) -> str:
        """ "on" or "off (why)", as the step plan names its choices."""
        return "on" if self.kept else f"off ({self.how})"


def keep_freed_memory(mode: Switch, *, cuda: bool) -> HostMemory:
    """The settings above applied (once per process) as `mode` asks for a run on a GPU
    (`cuda`) or not; `on` warns when they cannot be applied."""
    global _applied
    if _applied is not None and _applied.startswith(_KEPT):
        # A second run in the process (tests, notebooks): the first one's settings hold.
        return HostMemory(True, _applied)
    if mode == "off":
        return HostMemory(False, f"{KEY} is off")
    if mode == "auto" and cuda:
        return HostMemory(False, f"a GPU run ({KEY} auto: CPU runs only)")
    how = _apply()
    if how.startswith(_KEPT):
        _applied = how
        return HostMemory(True, how)
    if mode == "on":
        log.warning("%s is on but malloc is %s", KEY, how)
    return HostMemory(False, how)


_KEPT = "freed blocks kept"


def _user_choice() -> str:
    """Why the user's environment says to leave malloc alone, or ''."""
    preloaded = [lib for lib in os.environ.get("LD_PRELOAD", "").split() if "malloc" in lib]
    if preloaded:
        return f"preloaded allocator {' '.join(preloaded)}"
    chosen = [name for name in _THRESHOLD_VARS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        chosen.append("GLIBC_TUNABLES glibc.malloc.*")
    if chosen:
        return f"the user's malloc settings ({', '.join(chosen)})"
    return ""


def _apply() -> str:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "left to the C library (not glibc)"
    why = _user_choice()
    if why:
        return f"left to {why}"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "left alone (mallopt not found)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Either call switches off glibc's dynamic thresholds: set both.
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return "left alone (mallopt refused the mmap threshold)"
    if not mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return f"mmap threshold {MMAP_THRESHOLD >> 20} MiB; trim threshold refused"
    return (
        f"{_KEPT} for reuse (glibc mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 20} MiB; {KEY}: off leaves malloc alone)"
    )
