"""Freed host memory kept for reuse between CPU steps (`training.host_memory`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reagent_lite.config.models import StepPlanParameters
from reagent_lite.training import host_memory
from reagent_lite.training.step_plan import DEPRECATED_ENV, asked
from tests.conftest import REPO_ROOT

# Two grad-free parametric forwards (the target side of a parametric step: [16384, 256]
# activations, 16 MiB each), repeated; bytes page-faulted in the median repetition after a
# warm-up (transparent huge pages off for the process, so pages are the base size). Modes:
# "defaults" (glibc as it starts), "static" (one `mallopt` call, which freezes glibc's
# thresholds at their start values: the 128 KiB mmap threshold makes every activation a
# fresh mapping, faulted in on each use — the worst case of glibc's dynamic behaviour,
# reached deterministically), "static+keep" (then `keep_freed_memory`, which must undo it),
# "static+off" (then `keep_freed_memory` told off by the config, which must leave it).
_FAULTS = """
import ctypes, json, resource, statistics, sys
libc = ctypes.CDLL(None)
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
import torch
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.config.models import StepPlanParameters
from reagent_lite.training import host_memory
from reagent_lite.training.step_plan import DEPRECATED_ENV, asked
mode = sys.argv[1]
if mode.startswith("static"):
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    assert mallopt(host_memory.M_TRIM_THRESHOLD, 128 * 1024) == 1  # glibc's start value
ask = {"keep": "auto", "off": "off"}.get(mode.split("+")[-1])
how = host_memory.keep_freed_memory(ask, cuda=False).how if ask else mode
torch.manual_seed(0)
net = ParametricQNetwork(8, 6)
s, a = torch.randn(1024, 8), torch.randn(1024, 16, 6)
def step():
    with torch.no_grad():
        net(s, a)
        net(s, a)
for _ in range(3):
    step()
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
# The median repetition: the heap may still grow once (new pages, faulted once) when kept.
print(json.dumps([how, statistics.median(faults) * resource.getpagesize()]))
"""


def _faulted_bytes(mode: str) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    for name in ("LD_PRELOAD", "GLIBC_TUNABLES", "THP_MEM_ALLOC_ENABLE", *DEPRECATED_ENV.values()):
        env.pop(name, None)
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
    how, faulted = json.loads(proc.stdout.splitlines()[-1])
    return how, faulted


@pytest.mark.skipif(
    sys.platform != "linux" or host_memory.platform.libc_ver()[0] != "glibc",
    reason="page-fault counts and mallopt: Linux with glibc",
)
def test_kept_pages_are_not_faulted_in_again_each_step() -> None:
    mib = 2**20
    # The two forwards' activations are 2 × 2 × 16 MiB. Mapped afresh each use, all of them
    # are faulted in every repetition (measured 66 MiB); glibc's own defaults fault 16 MiB
    # (its heap top trimmed) in about two runs of three here; kept, nothing.
    _, static = _faulted_bytes("static")
    assert static > 32 * mib, static  # the measurement sees pages handed back
    how, kept = _faulted_bytes("static+keep")
    assert how.startswith("freed blocks kept"), how
    assert kept < 1 * mib, (kept, static)
    _, defaults = _faulted_bytes("defaults+keep")
    assert defaults < 1 * mib, defaults
    # `training.step_plan.keep_freed_memory: off`: malloc as it was, pages faulted again.
    how, left = _faulted_bytes("static+off")
    assert how == "training.step_plan.keep_freed_memory is off", how
    assert left > 32 * mib, left


Calls = list[tuple[int, int]]


@pytest.fixture
def fake_glibc(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """A stand-in for `ctypes.CDLL(None)` (so the env rules are tested without touching this
    process's malloc) on "Linux with glibc"; returns the `mallopt` calls made."""
    calls: Calls = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 1

    monkeypatch.setattr(host_memory.ctypes, "CDLL", lambda *a: SimpleNamespace(mallopt=mallopt))
    monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(host_memory, "_applied", None)  # as in a fresh process
    for name in (*host_memory._THRESHOLD_VARS, "GLIBC_TUNABLES", "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_both_thresholds_are_set(fake_glibc: Calls) -> None:
    assert host_memory._apply().startswith("freed blocks kept for reuse")
    assert fake_glibc == [
        (host_memory.M_MMAP_THRESHOLD, 32 * 2**20),
        (host_memory.M_TRIM_THRESHOLD, 512 * 2**20),
    ]


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("MALLOC_TRIM_THRESHOLD_", "1", "the user's malloc settings (MALLOC_TRIM_THRESHOLD_)"),
        (
            "GLIBC_TUNABLES",
            "glibc.malloc.trim_threshold=1",
            "the user's malloc settings (GLIBC_TUNABLES glibc.malloc.*)",
        ),
        (
            "LD_PRELOAD",
            "/usr/lib/libjemalloc.so.2",
            "preloaded allocator /usr/lib/libjemalloc.so.2",
        ),
    ],
)
def test_user_choices_are_left_alone(
    fake_glibc: Calls, monkeypatch: pytest.MonkeyPatch, name: str, value: str, why: str
) -> None:
    monkeypatch.setenv(name, value)
    assert host_memory._apply() == f"left to {why}"
    assert fake_glibc == []


@pytest.mark.parametrize(
    ("name", "value"),
    [("GLIBC_TUNABLES", "glibc.pthread.rseq=0"), ("LD_PRELOAD", "libeatmydata.so")],
)
def test_unrelated_settings_do_not_turn_it_off(
    fake_glibc: Calls, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    assert host_memory._apply().startswith("freed blocks kept for reuse")
    assert len(fake_glibc) == 2


def test_other_c_libraries_are_left_alone(
    fake_glibc: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    assert host_memory._apply() == "left to the C library (not glibc)"
    assert fake_glibc == []


def test_a_cpu_workflow_sets_it_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from reagent_lite.config.models import DQNWorkflowConfig
    from reagent_lite.distributed.context import DistContext
    from reagent_lite.training.loop import Workflow
    from tests.data.test_ingest import ACTIONS, rows, write

    data = write(tmp_path / "t.parquet", rows(200), 100)
    cfg = DQNWorkflowConfig(
        training_data_path=str(data),
        model_output_path=str(tmp_path / "out"),
        actions=ACTIONS,
        epochs=1,
        training={"layers": [-1, 8, -1], "activations": ["relu", "linear"], "minibatch_size": 32},
        evaluation={"calc_cpe_in_training": False},
    )
    wf = Workflow("dqn", cfg, DistContext.single("cpu"))
    with caplog.at_level(logging.INFO, logger="reagent_lite"):
        try:
            wf.setup()
        finally:
            wf.cleanup()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("host memory: ")]
    assert said == [f"host memory: {wf.host_memory.how}"]
    assert wf.host_memory.how == host_memory._applied


@pytest.mark.parametrize(
    ("mode", "cuda", "kept", "how"),
    [
        ("off", False, False, "training.step_plan.keep_freed_memory is off"),
        (
            "auto",
            True,
            False,
            "a GPU run (training.step_plan.keep_freed_memory auto: CPU runs only)",
        ),
        ("auto", False, True, "freed blocks kept for reuse"),
        ("on", True, True, "freed blocks kept for reuse"),
    ],
)
def test_the_config_decides(fake_glibc: Calls, mode: str, cuda: bool, kept: bool, how: str) -> None:
    got = host_memory.keep_freed_memory(mode, cuda=cuda)  # type: ignore[arg-type]
    assert got.kept == kept and got.how.startswith(how), got
    assert len(fake_glibc) == (2 if kept else 0)
    assert got.plan() == ("on" if kept else f"off ({got.how})")


def test_on_says_why_it_was_not_taken(
    fake_glibc: Calls, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc.so.4")
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        got = host_memory.keep_freed_memory("on", cuda=False)
    assert not got.kept and fake_glibc == []
    assert caplog.messages == [
        "training.step_plan.keep_freed_memory is on but malloc is left to preloaded "
        "allocator /usr/lib/libtcmalloc.so.4"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        host_memory.keep_freed_memory("auto", cuda=False)  # auto: silent, the plan says why
    assert caplog.messages == []


@pytest.mark.parametrize(
    ("value", "config", "want", "effect"),
    [
        ("0", "auto", "off", "read as training.step_plan.keep_freed_memory: off"),
        (
            "false",
            "on",
            "on",
            "ignored: the config sets training.step_plan.keep_freed_memory to on",
        ),
        ("1", "auto", "auto", "ignored: only 0, false, no or off ever had an effect"),
    ],
)
def test_the_deprecated_switch_maps_onto_the_plan(
    caplog: pytest.LogCaptureFixture, value: str, config: str, want: str, effect: str
) -> None:
    name = "REAGENT_LITE_KEEP_FREED_MEMORY"
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        got = asked(StepPlanParameters(keep_freed_memory=config), {name: value})  # type: ignore[arg-type]
    assert got.keep_freed_memory == want
    assert caplog.messages == [
        f"{name}={value} is deprecated and will be removed: set "
        f"training.step_plan.keep_freed_memory in the config instead (auto, on or off); {effect}"
    ]
    assert asked(StepPlanParameters(), {}) == StepPlanParameters()
