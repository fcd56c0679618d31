"""A generator's items made on a thread of their own, a few ahead of the caller."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterable
from typing import TypeVar

T = TypeVar("T")
_END = object()


def read_ahead(
    items: Iterable[T],
    *,
    depth: int = 2,
    name: str = "timeline-ahead",
    interrupt: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
) -> Generator[T, None, None]:
    """`items`, made by a thread up to `depth` ahead while the caller uses the last one
    (Arrow and DuckDB release the GIL while they work). An error there is raised here. A
    caller that stops early (an error, Ctrl-C, `close()`) sets `stop` (which long work
    inside `items` may watch), calls `interrupt` (say, to stop a DuckDB query), and the
    thread stops at its next item, closing `items`."""
    ready: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = stop if stop is not None else threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        iterator = iter(items)
        try:
            for item in iterator:
                if not put(item):
                    return
            put(_END)
        except BaseException as err:  # handed to the caller, raised there
            put(err)
        finally:
            if isinstance(iterator, Generator):
                iterator.close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    finished = False
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
        finished = True
    finally:
        stop.set()
        if not finished and interrupt is not None:
            interrupt()
        thread.join()
