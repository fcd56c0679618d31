"""The training step as `Workflow.train` runs it: eager, or the whole update as one CUDA graph.

`StepRunner.step()` is one optimizer step (its `minibatches_per_step` micro-batches, the
CPE side models if on) with no host synchronisation: indices come from the epoch's stream
already on the device, rows are gathered on the device, the loss is summed into a device
scalar. On CUDA with `cuda_graphs: true` the whole update — index lookup, gathers,
forwards, backward, fused Adam, soft target update, CPE step — is captured once and then
replayed, so a step costs one launch instead of a few hundred; if capture is impossible or
fails the runner says why and stays eager.

Several processes (DDP over NCCL): the DDP wrapper cannot live inside a graph (its reducer
works on the host), so the captured step goes around it — forwards through the plain
modules — and averages the gradients itself: one flat buffer per optimizer, divided by the
world size and all-reduced by NCCL inside the graph, between backward and the optimizer
step (`GradAllReduce`, hooked in as the trainers' `grad_sync`). The wrapper stays for what
it did at construction (rank 0's parameters broadcast, so replicas start identical) and
for the eager fallback, which every rank takes if capture fails on any rank (a failure in
the eager warm-up steps before capture, whose all-reduces run, stops the run). DDP keeps
the parameters' AccumulateGrad nodes alive, and autograd accumulates on the stream a node
was made on: made on the default stream, the captured backward would have to sync with
it, which invalidates the capture. So DDP is built on the stream the step is warmed up and
captured on (`ddp_construction`, `capture_stream`). An eager
one-element all-reduce every `_HEARTBEAT_STEPS` replays gives NCCL's watchdog something to
time out on, so a dead peer still ends the job within `collective_timeout_s`. CPU / gloo
runs never capture and keep the plain DDP path.

Data placement:
* resident (`device_resident_data: true`, or a CPU run not streaming from disk): the shard
  lives on the device; steps gather their rows from it;
* streamed from host (`device_resident_data: false` on CUDA): the shard stays in host
  memory; chunks of whole steps (in epoch order) are gathered by a worker thread straight
  into pinned buffers and copied to the device on a side stream while the GPU trains on
  the current chunk (`prefetch.ChunkPrefetcher.gathered`);
* streamed from disk (`stream_from_disk: true`): `DiskShardStream` yields host chunks
  (a shuffled window's rows); the same prefetcher cuts them to at most `chunk_rows` rows
  and, on CUDA, copies them through the same pinned buffers and side stream
  (`ChunkPrefetcher.ready`); on the CPU the chunks are used where they are.
Either way device memory holds at most two chunks (plus, with a graph, the static chunk
the graph reads, which each chunk is copied into), not the shard.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from reagent_lite.data.sampler import EpochSampler
from reagent_lite.data.tensordict import RowPack, TensorDict
from reagent_lite.errors import TrainingError
from reagent_lite.kinds.base import EVAL_ONLY_FIELDS
from reagent_lite.training.graphs import (
    GradAllReduce,
    WarmupSnapshot,
    adam_family,
    capture_stream,
    make_capturable,
)
from reagent_lite.training.prefetch import Chunk, ChunkPrefetcher

log = logging.getLogger("reagent_lite")

# Eager steps run before capture so that lazily created state (Adam moments, cuBLAS
# workspaces) exists; their effect on the model is undone afterwards.
_WARMUP_STEPS = 3
# Rows per streamed chunk (rounded to whole steps): large enough that the per-chunk
# handoff is noise, small enough that a few chunks fit any GPU next to the model.
DEFAULT_CHUNK_ROWS = 1 << 18
# Replays between the eager heartbeat all-reduces of a multi-process graph: well inside the
# host's queue of pending launches, so one is queued before the host could block on a dead
# peer; a one-element all-reduce per 64 steps costs well under 0.1%.
_HEARTBEAT_STEPS = 64


class LazyBatch:
    """Rows `idx` of `source`, gathered on first access of each field.

    Trainers read a handful of fields (`batch.state`, `batch.reward`, ...); gathering
    only those saves the bandwidth of the rest. `idx` is an index tensor or a slice (a
    streamed chunk is already in step order, so its batches are views). With `pack` (the
    shard's `RowPack`), the first packed field read gathers the rows of all of them at
    once and each is a view of those rows."""

    __slots__ = ("_cache", "_idx", "_pack", "_rows", "_source")

    def __init__(
        self, source: Mapping[str, Tensor], idx: Tensor | slice, pack: RowPack | None = None
    ):
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_idx", idx)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_pack", pack)
        object.__setattr__(self, "_rows", None)

    def __getattr__(self, name: str) -> Tensor:
        cache: dict[str, Tensor] = object.__getattribute__(self, "_cache")
        found = cache.get(name)
        if found is None:
            source = object.__getattribute__(self, "_source")
            if name not in source:
                raise AttributeError(name)
            idx = object.__getattribute__(self, "_idx")
            pack: RowPack | None = object.__getattribute__(self, "_pack")
            if pack is not None and name in pack.columns and not isinstance(idx, slice):
                rows = object.__getattribute__(self, "_rows")
                if rows is None:
                    rows = pack.matrix.index_select(0, idx)
                    object.__setattr__(self, "_rows", rows)
                found = pack.view(rows, name)
            else:
                column = source[name]
                found = column[idx] if isinstance(idx, slice) else column.index_select(0, idx)
            cache[name] = found
        return found

    def __getitem__(self, name: str) -> Tensor:
        return self.__getattr__(name)

    def __contains__(self, name: object) -> bool:
        return name in object.__getattribute__(self, "_source")


def training_columns(data: TensorDict) -> dict[str, Tensor]:
    """The shard's columns that training steps may read (no copies)."""
    return {k: v for k, v in data.items() if k not in EVAL_ONLY_FIELDS}


class StepRunner:
    """Runs the optimizer steps of one rank. `Workflow.train` calls `begin_epoch(epoch)`,
    then `step()` `steps_per_epoch` times, reading `loss_sum` (a device scalar)."""

    def __init__(
        self,
        *,
        trainer: Any,
        cpe: Any | None,
        q_net: nn.Module,
        data: TensorDict,
        sampler: EpochSampler,
        device: torch.device,
        steps_per_epoch: int,
        minibatches_per_step: int,
        minibatch_size: int,
        cuda_graphs: bool,
        resident: bool,
        distributed_wrapper: bool,
        chunk_rows: int | None = None,
        chunk_source: Any | None = None,
    ) -> None:
        self.trainer = trainer
        self.cpe = cpe
        self.q_net = q_net
        self.sampler = sampler
        self.device = device
        self.steps_per_epoch = steps_per_epoch
        self.mps = minibatches_per_step
        self.batch = minibatch_size
        self.step_rows = minibatch_size * minibatches_per_step
        self.columns = training_columns(data)
        self._pack = data.pack
        # `chunk_source` (stream_from_disk: `data.disk_stream.DiskShardStream`) hands out
        # each epoch's chunks itself, in host memory; `data` is then only a column template.
        self._disk = chunk_source
        self.streamed = (device.type == "cuda" and not resident) or chunk_source is not None
        self.loss_sum = torch.zeros((), device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.mode = "eager"
        self._want_graph = cuda_graphs and device.type == "cuda"
        self._why_eager = ""
        # World size when the graph all-reduces gradients itself (DDP over NCCL), else 0.
        self.graph_world = 0
        self._beat: Tensor | None = None
        self._replays = 0
        if self._want_graph:
            self._why_eager = self._graph_blocker(distributed_wrapper)
            self._want_graph = not self._why_eager
        self._eager_indices: Iterator[Tensor] | None = None
        self._chunks: Generator[Chunk, None, None] | None = None
        self._chunk: dict[str, Tensor] = {}
        self._chunk_steps = 0
        self._chunk_pos = 0
        if self.streamed:
            steps = max(1, (chunk_rows or DEFAULT_CHUNK_ROWS) // self.step_rows)
            self.chunk_rows = steps * self.step_rows
            if chunk_source is not None:
                # Its chunks (whole steps, up to a window's worth) are cut to this size on
                # the way to the device: device and pinned memory don't grow with windows.
                self.chunk_rows = min(self.chunk_rows, chunk_source.chunk_rows)
            self._prefetch = ChunkPrefetcher(self.columns, device, self.chunk_rows)
        # Graph inputs: the epoch's index stream [steps, rows per step] (or, streamed, an
        # arange over the static chunk) and the step counter, both on the device.
        self._pos = torch.zeros(1, dtype=torch.int64, device=device)
        self._static_src: dict[str, Tensor] = self.columns
        self._lr_tensors: list[Tensor] = []
        self._stream: Tensor | None = None

    # ------------------------------------------------------------------ policy
    def _graph_blocker(self, distributed_wrapper: bool) -> str:
        optimizers = [self.trainer.optimizer]
        if self.cpe is not None:
            optimizers.append(self.cpe.optimizer)
        if distributed_wrapper:
            wrapped = [self.trainer.q_net] + ([self.cpe.nets] if self.cpe is not None else [])
            if not all(isinstance(w, DistributedDataParallel) for w in wrapped):
                return "the network is wrapped by DataParallel (its steps run eagerly)"
            backend = dist.get_backend() if dist.is_initialized() else "none"
            if backend != "nccl":
                return f"DDP over {backend}: only NCCL all-reduces can be captured"
            self.graph_world = dist.get_world_size()
        if not all(adam_family(o) for o in optimizers):
            return f"optimizer {type(self.trainer.optimizer).__name__} is not Adam/AdamW"
        return ""

    def describe(self) -> str:
        if self._disk is not None:
            data = self._disk.describe()
        else:
            data = "streamed from host" if self.streamed else f"resident on {self.device}"
        if self.streamed and self._prefetch.cuda:
            data += (
                f"; chunks of {self.chunk_rows} rows copied to {self.device} from pinned "
                "buffers on a side stream while the previous chunk trains"
            )
        mode = "one CUDA graph per step" if self.mode == "graph" else "eager"
        if self.mode == "graph" and self.graph_world:
            mode += f" (gradients all-reduced inside the graph over {self.graph_world} ranks)"
        why = f" ({self._why_eager})" if self._why_eager and self.mode != "graph" else ""
        return f"training step: {mode}{why}; data {data}"

    # ------------------------------------------------------------------- epoch
    def begin_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.loss_sum.zero_()
        if self.streamed:
            self.close()  # the last epoch's stream: its worker is gone before a new one starts
            if self._disk is not None:
                self._chunks = self._prefetch.ready(self._disk.epoch_chunks(epoch))
            else:
                order = self.sampler.epoch_indices(epoch).cpu()
                self._chunks = self._prefetch.gathered(self.columns, order)
            self._chunk_steps = self._chunk_pos = 0
        elif self._want_graph or self.mode == "graph":
            stream = self.sampler.epoch_indices(epoch).view(self.steps_per_epoch, self.step_rows)
            if self._stream is None:
                self._stream = stream.to(self.device).contiguous()
            else:
                self._stream.copy_(stream)
            self._pos.zero_()
        else:
            self._eager_indices = iter(self.sampler)
        if self._want_graph and self.graph is None:
            self._try_capture()
            self.loss_sum.zero_()
        if self.mode == "graph" and self.trainer.optimizer.param_groups:
            self._sync_lr()

    def close(self) -> None:
        """Ends the epoch's chunk stream, if any (joins its worker thread); idempotent."""
        chunks, self._chunks, self._chunk = self._chunks, None, {}
        if chunks is not None:
            chunks.close()

    def _sync_lr(self) -> None:
        """The scheduler may have put a float where the graph reads a tensor: copy it back."""
        for group, lr in zip(self.trainer.optimizer.param_groups, self._lr_tensors, strict=True):
            if group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr

    # -------------------------------------------------------------------- step
    def step(self) -> None:
        if self.streamed:
            self._next_streamed_step()
            self._chunk_pos += 1  # the step counter of the chunk (the graph keeps its own)
        if self.mode == "graph":
            assert self.graph is not None
            self.graph.replay()
            if self._beat is not None:
                self._replays += 1
                if self._replays % _HEARTBEAT_STEPS == 0:
                    dist.all_reduce(self._beat)
            return
        if self.streamed:
            start = (self._chunk_pos - 1) * self.step_rows
            batches = [
                LazyBatch(self._chunk, slice(start + j * self.batch, start + (j + 1) * self.batch))
                for j in range(self.mps)
            ]
        else:
            assert self._eager_indices is not None
            batches = [
                LazyBatch(self.columns, next(self._eager_indices), self._pack)
                for _ in range(self.mps)
            ]
        self._update(batches)

    def _update(self, batches: list[Any]) -> None:
        record = self.trainer.train_step(batches)
        self.loss_sum += record.total
        if self.cpe is not None:
            self.cpe.train_step(batches[0], self.q_net)

    def _graph_body(self) -> None:
        assert self._stream is not None
        rows = self._stream.index_select(0, self._pos).view(self.mps, self.batch)
        self._pos.add_(1)
        self._update([LazyBatch(self._static_src, rows[j]) for j in range(self.mps)])

    def _next_streamed_step(self) -> None:
        if self._chunk_pos < self._chunk_steps:
            return
        assert self._chunks is not None
        self._chunk = {}  # done with it: the prefetcher may stage the chunk after the next
        chunk, rows = next(self._chunks)
        self._chunk_steps, self._chunk_pos = rows // self.step_rows, 0
        if self.mode == "graph":
            for k, t in chunk.items():
                self._static_src[k][:rows].copy_(t)
            self._pos.zero_()
        else:
            self._chunk = chunk

    # ----------------------------------------------------------------- capture
    def _modules(self) -> list[nn.Module]:
        mods = [self.trainer.online, self.trainer.target]
        if self.cpe is not None:
            mods += [self.cpe.nets, self.cpe.target_value]
        return mods

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        opts = [self.trainer.optimizer]
        if self.cpe is not None:
            opts.append(self.cpe.optimizer)
        return opts

    @contextlib.contextmanager
    def _explicit_grad_sync(self) -> Iterator[None]:
        """Inside: forwards go through the plain modules and the trainers all-reduce
        gradients themselves (what the graph captures); restored on the way out."""
        trainer, cpe = self.trainer, self.cpe
        saved_q = trainer.q_net
        trainer.q_net = trainer.online
        trainer.grad_sync = GradAllReduce(list(trainer.online.parameters()), self.graph_world)
        saved_cpe = None
        if cpe is not None:
            saved_cpe = cpe.nets
            raw = cpe._raw()
            cpe.nets = raw
            cpe.grad_sync = GradAllReduce(list(raw.parameters()), self.graph_world)
        try:
            yield
        finally:
            trainer.q_net, trainer.grad_sync = saved_q, None
            if cpe is not None:
                cpe.nets, cpe.grad_sync = saved_cpe, None

    def _agree(self, ok: bool) -> bool:
        """True when capture succeeded on every rank (a graph holding a collective must be
        replayed by all ranks or by none)."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def _warmup_failed(self, failure: str) -> TrainingError:
        """Before capture, the ranks run eager steps whose gradient all-reduces execute: a
        rank that failed there cannot fall back alone — its peers wait inside one, and the
        all-reduce that would agree on the fallback would pair with theirs. So it stops the
        run; the launcher ends the node's other ranks, other nodes' time out."""
        return TrainingError(
            f"cuda_graphs: {failure} on rank {dist.get_rank()} of {self.graph_world}, in an "
            "eager step before capture: the other ranks may be inside its gradient "
            "all-reduce, so this rank cannot fall back to eager training alone and the run "
            "stops (with `cuda_graphs: false` every rank trains eagerly from the start)"
        )

    def _try_capture(self) -> None:
        """Warm up, capture, undo the warm-up; if capture fails (on any rank) stay eager and
        say why. Over several ranks a failure before capture is fatal (`_warmup_failed`)."""
        self._want_graph = False
        # Capturable first: it may move step counters, which the snapshot must then hold.
        make_capturable(self.trainer.optimizer, self.device, lr_tensor=True)
        self._lr_tensors = [g["lr"] for g in self.trainer.optimizer.param_groups]
        if self.cpe is not None:
            make_capturable(self.cpe.optimizer, self.device, lr_tensor=False)
        snapshot = WarmupSnapshot(self._modules(), self._optimizers())
        sync = self._explicit_grad_sync() if self.graph_world else contextlib.nullcontext()
        # Thread-local: NCCL's watchdog thread queries events while we capture.
        mode = "thread_local" if self.graph_world else "global"
        failure = ""
        phase = "warm-up"
        try:
            if self.streamed:
                self._static_src = {
                    k: torch.zeros(
                        (self.chunk_rows, *v.shape[1:]), dtype=v.dtype, device=self.device
                    )
                    for k, v in self.columns.items()
                }
                self._stream = torch.arange(self.chunk_rows, device=self.device).view(
                    -1, self.step_rows
                )
            with sync:
                side = (
                    capture_stream(self.device)
                    if self.graph_world
                    else torch.cuda.Stream(self.device)
                )
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(_WARMUP_STEPS):
                        self._pos.zero_()
                        self._graph_body()
                torch.cuda.current_stream(self.device).wait_stream(side)
                for opt in self._optimizers():
                    opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize(self.device)
                phase = "capture"
                graph = torch.cuda.CUDAGraph()
                # Multi-process: captured on the warm-up stream, DDP's (module notes).
                on = side if self.graph_world else None
                with torch.cuda.graph(graph, stream=on, capture_error_mode=mode):
                    self._graph_body()
        except Exception as err:  # a capture problem: eager is always correct (one rank)
            if isinstance(err, dist.DistError):
                raise  # a collective failed (a peer died): the launcher's error, not ours
            frames = traceback.extract_tb(err.__traceback__)
            at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
            first = (str(err).splitlines() or [""])[0]
            failure = f"CUDA graph {phase} failed: {type(err).__name__}: {first}{at}"
            if self.graph_world and phase == "warm-up":
                raise self._warmup_failed(failure) from err
        torch.cuda.synchronize(self.device)
        if failure:
            log.warning("cuda_graphs: %s; training eagerly", failure)
        if self.graph_world and not self._agree(not failure) and not failure:
            failure = "CUDA graph capture failed on another rank (its log says why)"
            log.warning("cuda_graphs: %s; training eagerly", failure)
        snapshot.restore()
        if failure:
            self._why_eager = failure
            self._static_src = self.columns
            if not self.streamed:
                self._eager_indices = iter(self.sampler)
            return
        self._pos.zero_()
        self.graph = graph
        self.mode = "graph"
        if self.graph_world:
            self._beat = torch.zeros(1, device=self.device)
