"""Micro-batching: requests that arrive within a few milliseconds share one forward pass.

Callers `await batcher.submit(item)`; one collector task takes the first waiting item, waits
for more (at most `max_batch`), and runs `run_batch(items)` on the model's own thread. While a
batch runs, new requests queue up. How long a batch waits for more: `window_ms`, or 2% of the
last batch's run time where that is longer. Why the second: when a batch of N answers goes
out, its N clients ask again within a few milliseconds of each other, and a fixed 5 ms window
closes on half of them; on a CPU whose forward pass takes seconds, the clients then stay split
into two half-size batches for good. Waiting 2% of a pass to fill it costs at most 2% latency.
`max_batch=1` is the one-at-a-time baseline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

FILL_FRACTION = 0.02  # of the last batch's run time, the longest a new batch waits to fill up
Item = TypeVar("Item")
Result = TypeVar("Result")


class MicroBatcher(Generic[Item, Result]):
    """Collects submitted items into batches for `run_batch(items) -> results` (same order).

    `run_batch` runs on `executor` (one thread that owns the model); an exception it raises is
    given to every caller of that batch. Start with `start()` inside the event loop that will
    submit, stop with `await stop()`.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[Item]], Sequence[Result]],
        *,
        executor: Executor,
        max_batch: int = 32,
        window_ms: float = 5.0,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if window_ms < 0:
            raise ValueError(f"window_ms must be >= 0, got {window_ms}")
        self.run_batch = run_batch
        self.executor = executor
        self.max_batch = max_batch
        self.window_s = window_ms / 1000.0
        self._last_run_s = 0.0  # how long the last batch took (the window stretches to 2% of it)
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the collector task on the running event loop."""
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="atlas-micro-batcher")

    async def stop(self) -> None:
        """Stop collecting; callers still waiting get a `RuntimeError`."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        while self._queue is not None and not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(RuntimeError("the server is shutting down"))

    async def submit(self, item: Item) -> tuple[Result, int]:
        """Queue `item`; → (its result, the size of the batch it ran in)."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.submit before start()")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future))
        return await future

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + max(self.window_s, FILL_FRACTION * self._last_run_s)
            while len(batch) < self.max_batch:
                if not self._queue.empty():  # already waiting: take without waiting
                    batch.append(self._queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:  # what asyncio.wait_for raises from Python 3.11 on
                    break
            live = [(item, future) for item, future in batch if not future.cancelled()]
            if not live:
                continue
            started = loop.time()
            try:
                results = await loop.run_in_executor(self.executor, self.run_batch, [item for item, _ in live])
            except Exception as e:  # noqa: BLE001 (every caller of the batch gets it; the collector lives on)
                for _, future in live:
                    if not future.done():
                        future.set_exception(e)
                continue
            finally:
                self._last_run_s = loop.time() - started
            for (_, future), result in zip(live, results):
                if not future.done():
                    future.set_result((result, len(live)))
