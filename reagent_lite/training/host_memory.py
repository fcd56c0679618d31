"""Host memory between training steps: keep freed blocks for reuse (glibc malloc).

A CPU step allocates and frees the same large activations every step (a parametric step at
batch 1024 with 16 candidates: several [16384, 256] float tensors, 16 MiB each). glibc's
malloc adapts its thresholds to such sizes, but still hands the top of the heap back to the
kernel whenever more than twice the largest recent block is free there — so every step
the kernel zero-fills the same pages again: 16,000 page faults a step for the parametric
reference step on an Intel Xeon, which made it ≈ 1.6× slower than with the pages kept
(`benchmarks/RESULTS.md`). PyTorch's CPU tuning notes recommend jemalloc / tcmalloc for
this; the same effect from glibc itself is two `mallopt` settings:

* `M_MMAP_THRESHOLD` = 32 MiB (glibc's upper limit): blocks below come from the heap,
  where they can be reused, rather than from fresh `mmap`s;
* `M_TRIM_THRESHOLD` = 512 MiB: free memory at the heap's top is returned to the kernel
  only beyond that much.

Set once, when a CPU training run starts (after its data are loaded: ingest's transient
peaks are still returned). The cost: up to 512 MiB of freed heap stays with the process
for reuse. Left alone when the process runs another allocator (`LD_PRELOAD`) or when the
user set glibc's malloc tunables (`MALLOC_*_` variables, `GLIBC_TUNABLES`), and outside glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 512 * 2**20

_USER_TUNABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
)

_applied: str | None = None


def keep_freed_memory() -> str:
    """Apply the settings above (once per process); returns what was done, for the log."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> str:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "left to the C library (not glibc)"
    preload = os.environ.get("LD_PRELOAD", "")
    if preload:
        return f"left to LD_PRELOAD ({preload})"
    chosen = [name for name in _USER_TUNABLES if name in os.environ]
    if chosen:
        return f"left to the user's malloc settings ({', '.join(chosen)})"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "left alone (mallopt not found)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Either call switches off glibc's dynamic thresholds: set both.
    if not (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return "left alone (mallopt refused)"
    return (
        f"freed blocks kept for reuse (glibc mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 20} MiB)"
    )
