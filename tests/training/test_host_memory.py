"""Freed host memory kept for reuse between CPU steps (`training.host_memory`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reagent_lite.training import host_memory
from tests.conftest import REPO_ROOT

# Two grad-free parametric forwards (the target side of a parametric step: [16384, 256]
# activations, 16 MiB each), repeated; page faults per repetition after a warm-up.
_FAULTS = """
import json, resource, sys
import torch
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.training.host_memory import keep_freed_memory
how = keep_freed_memory() if sys.argv[1] == "keep" else "glibc defaults"
torch.manual_seed(0)
net = ParametricQNetwork(8, 6)
s, a = torch.randn(1024, 8), torch.randn(1024, 16, 6)
def step():
    with torch.no_grad():
        net(s, a)
        net(s, a)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(json.dumps([how, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5]))
"""


def _faults(mode: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    how, faults = json.loads(proc.stdout.splitlines()[-1])
    return how, faults


@pytest.mark.skipif(sys.platform != "linux", reason="page-fault counts and mallopt: Linux")
def test_kept_pages_are_not_faulted_in_again_each_step() -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env.pop("GLIBC_TUNABLES", None)
    how, kept = _faults("keep", env)
    if not how.startswith("freed blocks kept"):
        pytest.skip(f"not glibc here: {how}")
    _, default = _faults("default", env)
    if default < 500:
        pytest.skip(f"this glibc keeps these pages by itself ({default:.0f} faults a step)")
    # 2 × 16 MiB activations are ≈ 8,000 pages: with the defaults, measured ≈ 2,450 faults
    # a repetition here; kept, none.
    assert kept < default / 20, (kept, default)


def test_user_choices_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[object] = []
    monkeypatch.setattr(host_memory.ctypes, "CDLL", lambda *a: called.append(a))
    monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    for name, value in (("MALLOC_TRIM_THRESHOLD_", "1"), ("GLIBC_TUNABLES", "glibc.malloc.x=1")):
        monkeypatch.setenv(name, value)
        assert "user's malloc settings" in host_memory._apply()
        assert name in host_memory._apply()
        monkeypatch.delenv(name)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert host_memory._apply() == "left to LD_PRELOAD (/usr/lib/libjemalloc.so.2)"
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    assert host_memory._apply() == "left to the C library (not glibc)"
    assert called == []  # mallopt was never looked up
