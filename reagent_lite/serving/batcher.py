"""Concurrent `/v1/act` requests gathered into one model call.

A request waits at most `max_wait_s` for others to join it (up to `max_batch`); while the
model runs a batch (in one worker thread, so the event loop keeps accepting), the requests
that arrive queue up and form the next batch: under load, batches grow by themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger("reagent_lite.serving")

In = TypeVar("In")
Out = TypeVar("Out")


class Batcher(Generic[In, Out]):
    def __init__(
        self, run: Callable[[Sequence[In]], list[Out]], max_batch: int, max_wait_s: float
    ) -> None:
        self._run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._items: deque[tuple[In, asyncio.Future[Out]]] = deque()
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def submit(self, item: In) -> Out:
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._items.append((item, future))
        self._arrived.set()
        return await future

    async def stop(self) -> None:
        """Answers what is queued, then stops (the server has stopped taking requests)."""
        self._stopping = True
        self._arrived.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._items:
                if self._stopping:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            deadline = loop.time() + self.max_wait_s
            while len(self._items) < self.max_batch and not self._stopping:
                left = deadline - loop.time()
                if left <= 0:
                    break
                self._arrived.clear()
                try:  # an Event, not a queue get: a timeout never loses an item
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    break
            await self._run_batch()

    async def _run_batch(self) -> None:
        batch = [self._items.popleft() for _ in range(min(self.max_batch, len(self._items)))]
        items = [item for item, _ in batch]
        try:
            outs = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run, items
            )
        except Exception as err:  # answered as errors; the loop goes on with the next batch
            log.exception("serving: a batch of %d requests failed", len(batch))
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), out in zip(batch, outs, strict=True):
            if not future.done():  # a client that went away cancelled its future
                future.set_result(out)
