"""The batch sources of the training step (`training/sources.py`), on the CPU: what a
captured step would read through the static buffers (`static()`, `stage()`, then the
device-side index lookup of `StaticRows.batches()`) is, step after step and epoch after
epoch, what the eager step reads (`batches()`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from reagent_lite.config.models import StepPlanParameters, StepVariants
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.rows import Rows
from reagent_lite.data.sampler import EpochSampler
from reagent_lite.data.windows import stream_units
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.host_memory import HostMemory
from reagent_lite.training.prefetch import ChunkPrefetcher
from reagent_lite.training.sources import (
    BatchSource,
    DiskStreamed,
    HostStreamed,
    LazyBatch,
    ResidentRows,
    training_columns,
    windows_fit,
)
from reagent_lite.training.steps import DEFAULT_CHUNK_ROWS, build_step_runner
from reagent_lite.training.update import Update
from tests.data.test_disk_stream import load_window
from tests.data.test_ingest import rows, write

CPU = torch.device("cpu")
ROWS, BATCH, MPS = 50, 4, 2


def _data() -> Rows:
    g = torch.Generator().manual_seed(0)
    return Rows(
        {
            "state": torch.randn(ROWS, 3, generator=g),
            "reward": torch.arange(ROWS).float(),
            "action": torch.randint(0, 2, (ROWS,), generator=g),
            "mdp_id": torch.arange(ROWS),
        }
    )


def _sampler(steps: int) -> EpochSampler:
    return EpochSampler(ROWS, BATCH, steps * MPS, seed=3)


def _fields(batches: list[LazyBatch]) -> list[tuple[Tensor, Tensor, Tensor]]:
    return [(b.state, b.reward, b.action) for b in batches]


def _same(a: list[LazyBatch], b: list[LazyBatch]) -> None:
    assert len(a) == len(b) == MPS
    for x, y in zip(_fields(a), _fields(b), strict=True):
        for u, v in zip(x, y, strict=True):
            assert torch.equal(u, v)


def _static_steps(source: BatchSource, steps: int) -> list[list[LazyBatch]]:
    static = source.static()
    out = []
    for _ in range(steps):
        source.stage()
        out.append(static.batches())
    return out


def test_resident_static_rows_are_the_eager_rows_every_epoch() -> None:
    data, steps = _data().packed(), 9  # 9 steps of 8 rows: the 50 rows wrap around
    eager = ResidentRows(training_columns(data), data.pack, _sampler(steps), steps, MPS, BATCH)
    graph = ResidentRows(training_columns(data), None, _sampler(steps), steps, MPS, BATCH)
    assert "mdp_id" not in graph.static()  # evaluation-only columns are not read
    for epoch in range(3):
        eager.begin_epoch(epoch)
        graph.begin_epoch(epoch)  # refreshes the static index table, rewinds its counter
        static = graph.static_rows
        assert static is not None
        for _ in range(steps):
            graph.stage()
            _same(static.batches(), eager.batches())
    graph.release_static()
    assert graph.static_rows is None


def test_host_streamed_static_chunks_are_the_eager_rows() -> None:
    # Chunks of 2 steps over 7 steps a epoch: the last chunk is shorter.
    data, steps, chunk = _data(), 7, 2 * MPS * BATCH
    columns = training_columns(data)
    eager = HostStreamed(columns, _sampler(steps), CPU, chunk, MPS, BATCH)
    graph = HostStreamed(columns, _sampler(steps), CPU, chunk, MPS, BATCH)
    resident = ResidentRows(columns, None, _sampler(steps), steps, MPS, BATCH)
    try:
        for epoch in range(2):
            for source in (eager, graph, resident):
                source.begin_epoch(epoch)
            if epoch == 0:
                static = graph.static()
                assert len(static) == chunk and all(v.shape[0] == chunk for v in static.values())
            for _ in range(steps):
                graph.stage()
                want = eager.batches()
                _same(static.batches(), want)
                _same(want, resident.batches())  # in epoch order, as the resident rows
    finally:
        eager.close()
        graph.close()


def test_runner_steps_eagerly_on_the_cpu_and_says_where_rows_are() -> None:
    from reagent_lite.trainers.common import DQNHyperParams
    from reagent_lite.trainers.dqn import DQNTrainer

    data, steps = _data().packed(), 5
    net = torch.nn.Linear(3, 2)
    trainer = DQNTrainer(net, DQNHyperParams(minibatches_per_step=MPS), n_actions=2)
    data = Rows(
        {
            **dict(data.items()),
            "next_state": data.state.flip(0),
            "next_action": data.action,
            "terminal": torch.zeros(ROWS),
            "time_diff": torch.ones(ROWS),
            "possible_actions_mask": torch.ones(ROWS, 2),
            "possible_next_actions_mask": torch.ones(ROWS, 2),
        }
    ).packed()
    runner = build_step_runner(
        trainer=trainer,
        cpe=None,
        ctx=DistContext.single(CPU),
        data=data,
        sampler=_sampler(steps),
        steps_per_epoch=steps,
        minibatches_per_step=MPS,
        minibatch_size=BATCH,
        cuda_graphs=True,  # no CUDA: eager
        resident=False,  # on the CPU the shard is where the step runs
        precision="fp32",
        compiled=False,
        step_variants=StepVariants(),
        step_plan=StepPlanParameters(),
        host_memory=HostMemory(False, "left alone"),
    )
    assert isinstance(runner.source, ResidentRows) and isinstance(runner.update, Update)
    assert runner.describe().startswith("training step: eager, fp32; data resident on cpu; plan: ")
    assert runner.step_rows == MPS * BATCH < DEFAULT_CHUNK_ROWS
    before = net.weight.detach().clone()
    runner.begin_epoch(0)
    for _ in range(steps):
        runner.step()
    assert runner.mode == "eager" and not runner.streamed
    assert not torch.equal(before, net.weight) and torch.isfinite(runner.loss_sum)
    runner.close()


class _RecordingSampler(EpochSampler):
    """An `EpochSampler` that notes which epochs' orders were drawn, and when."""

    def __init__(self, steps: int) -> None:
        super().__init__(ROWS, BATCH, steps * MPS, seed=3)
        self.drawn: list[int] = []

    def epoch_indices(self, epoch: int) -> Tensor:
        self.drawn.append(epoch)
        return super().epoch_indices(epoch)


def _prefetching(source: HostStreamed) -> HostStreamed:
    # One chunk prepared ahead, as on CUDA (on the CPU the default is none).
    source.prefetcher = ChunkPrefetcher(source.template, CPU, source.chunk_rows, ahead=1)
    return source


def test_the_next_epochs_first_chunk_is_prepared_while_the_last_one_trains() -> None:
    data, steps, chunk = _data(), 6, 2 * MPS * BATCH  # 3 chunks an epoch
    columns = training_columns(data)
    sampler = _RecordingSampler(steps)
    source = _prefetching(HostStreamed(columns, sampler, CPU, chunk, MPS, BATCH, epochs=3))
    resident = ResidentRows(columns, None, _sampler(steps), steps, MPS, BATCH)
    try:
        for epoch in range(3):
            source.begin_epoch(epoch)
            resident.begin_epoch(epoch)
            for _ in range(steps):
                _same(source.batches(), resident.batches())
            # The epoch's last chunk is in training: its successor is already staged, and
            # for all but the last epoch that is the next epoch's first.
            deadline = time.monotonic() + 10.0
            while sampler.drawn[-1] != min(epoch + 1, 2) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sampler.drawn == list(range(min(epoch + 2, 3)))
        assert sampler.drawn == [0, 1, 2]  # one stream, no epoch drawn twice, none past the run
    finally:
        source.close()


def test_an_epoch_left_early_or_out_of_turn_starts_a_fresh_stream() -> None:
    data, steps, chunk = _data(), 6, 2 * MPS * BATCH
    columns = training_columns(data)
    source = _prefetching(HostStreamed(columns, _sampler(steps), CPU, chunk, MPS, BATCH, epochs=5))
    resident = ResidentRows(columns, None, _sampler(steps), steps, MPS, BATCH)
    try:
        source.begin_epoch(0)
        for _ in range(steps - 1):  # one step short of the epoch's end
            source.batches()
        for epoch in (1, 3):  # left early, then out of turn: rows of the epoch asked for
            source.begin_epoch(epoch)
            resident.begin_epoch(epoch)
            got = torch.cat([b.reward for _ in range(steps) for b in source.batches()])
            want = torch.cat([b.reward for _ in range(steps) for b in resident.batches()])
            assert torch.equal(got, want), epoch
    finally:
        source.close()


def test_every_source_hands_out_rows_of_one_container(tmp_path: Path) -> None:
    """Resident, host-streamed, disk-streamed: each step's micro-batches and a graph's
    static buffers are `Rows` (the one container), read as the trainers read them."""
    data, steps, chunk = _data(), 3, 2 * MPS * BATCH
    columns = training_columns(data)
    assert isinstance(columns, Rows) and "mdp_id" not in columns
    stream = _disk_stream(write(tmp_path / "t.parquet", rows(60), 16), MPS * BATCH, steps)
    disk_template = Rows({"reward": torch.zeros(1)})
    sources: list[BatchSource] = [
        ResidentRows(columns, data.pack, _sampler(steps), steps, MPS, BATCH),
        HostStreamed(columns, _sampler(steps), CPU, chunk, MPS, BATCH, epochs=1),
        DiskStreamed(stream, disk_template, CPU, chunk, MPS, BATCH, epochs=1),
    ]
    try:
        for source in sources:
            source.begin_epoch(0)
            for _ in range(steps):
                batches = source.batches()
                assert len(batches) == MPS and all(isinstance(b, Rows) for b in batches)
                assert all(len(b) == BATCH == b.reward.shape[0] for b in batches)
            assert isinstance(source.static(), Rows)
    finally:
        for source in sources:
            source.close()
        stream.close()


def _disk_stream(path: Path, step_rows: int, steps: int) -> DiskShardStream:
    def load(units: Sequence[ShardPiece]) -> dict[str, Tensor]:
        return {"reward": torch.from_numpy(load_window(units).fields["reward"])}

    stream = DiskShardStream(stream_units(str(path), 0, 1), load, window_rows=32, seed=0, rank=0)
    stream.configure(step_rows=step_rows, steps_per_epoch=steps)
    return stream


def test_disk_windows_go_to_the_gpu_only_where_they_fit() -> None:
    """A GPU run's disk windows live on the device (issue 39) only while `depth` + 2 of them
    take at most half its free memory; otherwise they stay in host memory, as before."""
    template = Rows({"state": torch.zeros(3, 4), "action": torch.zeros(3, dtype=torch.int64)})
    row = 4 * 4 + 8  # bytes
    need = (3 + 2) * 1000 * row
    assert windows_fit(template, 1000, 3, 2 * need)
    assert not windows_fit(template, 1000, 3, 2 * need - 1)
    assert not windows_fit(template, 1000, 3, None)  # free memory unknown


def test_streamed_sources_count_the_seconds_the_step_waits_for_rows(tmp_path: Path) -> None:
    """`waited` (the epoch record's `data_wait_s`): a disk stream whose windows take 0.3 s
    each to load makes the step wait for about that per window, counted from the epoch's
    start; a resident source never waits and reports nothing."""
    path = write(tmp_path / "t.parquet", rows(60), 16)
    steps = 4  # 4 steps of 8 rows: windows of 32 rows (two row groups), 1 window each 4 steps

    def slow(units: Sequence[ShardPiece]) -> dict[str, Tensor]:
        time.sleep(0.3)
        return {"reward": torch.from_numpy(load_window(units).fields["reward"])}

    stream = DiskShardStream(stream_units(str(path), 0, 1), slow, window_rows=32, seed=0, rank=0)
    stream.configure(step_rows=MPS * BATCH, steps_per_epoch=steps)
    source = DiskStreamed(stream, Rows({"reward": torch.zeros(1)}), CPU, 32, MPS, BATCH, epochs=2)
    try:
        for epoch in (0, 1):
            source.begin_epoch(epoch)
            assert source.waited == 0.0
            for _ in range(steps):
                source.batches()
            # The epoch's one window: loaded while the step waited (read ahead for epoch 1
            # while epoch 0 trained, but epoch 0's few steps take far less than 0.3 s).
            assert source.waited is not None and 0.2 < source.waited < 5, source.waited
    finally:
        source.close()
    data = _data()
    resident = ResidentRows(training_columns(data), data.pack, _sampler(steps), steps, MPS, BATCH)
    resident.begin_epoch(0)
    resident.batches()
    assert resident.waited is None
