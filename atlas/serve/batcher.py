"""Micro-batching: requests that arrive within a few milliseconds share one forward pass.

Callers `await batcher.submit_many(items)` (a request's questions); one collector task takes the
waiting items, waits for more (at most `max_batch`, and at most `max_cost` of work), and runs
`run_batch(items)` on the model's own thread. While a batch runs, new requests queue up.

Bounded, and fair between requests:
- the queue holds at most `max_queue` items; a request that does not fit whole is refused at once
  (`QueueFull`, with how long the queue should take to drain: its cost at the model's measured pace) rather
  than left waiting;
- a batch is filled one item per request in turn (round robin), so a request of 64 questions is
  sliced across batches and a one-question request that arrives meanwhile rides in the next batch
  instead of waiting behind all 64; with `max_cost` a batch also holds at most that much work
  (`cost(item)` summed), and a batch of heavy requests' items, with `max_seconds`, at most that much time of it at
  the model's measured pace;
- with `light_cost`, a light request (its items cost at most that together) is batched with light ones only,
  ahead of the heavy ones: it waits for the batch already running, and its own batch is light;
- an item whose caller stopped waiting (its deadline passed: the future is cancelled) is dropped
  before it runs.

How long a batch waits for more: `window_ms`, or 2% of the last batch's run time where that is
longer. Why the second: when a batch of N answers goes out, its N clients ask again within a few
milliseconds of each other, and a fixed 5 ms window closes on half of them; on a CPU whose forward
pass takes seconds, the clients then stay split into two half-size batches for good. Waiting 2% of
a pass to fill it costs at most 2% latency. `max_batch=1` is the one-at-a-time baseline.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

FILL_FRACTION = 0.02  # of the last batch's run time, the longest a new batch waits to fill up
Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Request:
    """One request's items waiting for the model, in order, each with the future its caller awaits."""

    items: deque
    light: bool = False  # its items cost at most the batcher's `light_cost` together


class QueueFull(RuntimeError):
    """The batcher's queue has no room for a request (HTTP 503); `retry_after_s`: about how long it needs to drain."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class MicroBatcher(Generic[Item, Result]):
    """Collects submitted items into batches for `run_batch(items) -> results` (same order).

    `run_batch` runs on `executor` (one thread that owns the model); an exception it raises is
    given to every caller of that batch. Start with `start()` inside the event loop that will
    submit, stop with `await stop()`. `cost(item)`: the work of one item (default 1); `max_cost`:
    the most work one batch holds (an item costing more runs alone); `light_cost`: a request whose items cost at
    most this together is light: while one waits, the next batch is made of light requests' items only, so a
    light question waits for the batch already running, never rides in a batch of a heavy request's (None: no
    light lane). `max_seconds`: once the model's pace is measured, a batch of heavy requests' items also holds at
    most this many seconds of work (its cost at that pace; one item at least), so what a light request waits for
    is bounded in time on any machine (None: by `max_cost` only).
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[Item]], Sequence[Result]],
        *,
        executor: Executor,
        max_batch: int = 32,
        window_ms: float = 5.0,
        max_queue: int = 256,
        cost: Callable[[Item], int] = lambda _item: 1,
        max_cost: int | None = None,
        light_cost: int | None = None,
        max_seconds: float | None = None,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if window_ms < 0:
            raise ValueError(f"window_ms must be >= 0, got {window_ms}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.run_batch = run_batch
        self.executor = executor
        self.max_batch = max_batch
        self.window_s = window_ms / 1000.0
        self.max_queue = max_queue
        self.cost = cost
        self.max_cost = max_cost if max_cost is not None else math.inf
        self.light_cost = light_cost if light_cost is not None else -math.inf
        self.max_seconds = max_seconds if max_seconds is not None else math.inf
        self._last_run_s = 0.0  # how long the last batch took (the window stretches to 2% of it)
        self._seconds_per_cost = 0.0  # the model's measured pace: a moving average over the last batches
        self._groups: deque[_Request] | None = None  # one per request, in turn
        self._waiting = 0  # items in _groups
        self._waiting_cost = 0.0  # their cost
        self._light_waiting = 0  # of them, items of light requests
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def waiting(self) -> int:
        """Items queued and not yet taken into a batch."""
        return self._waiting

    def start(self) -> None:
        """Start the collector task on the running event loop."""
        self._groups = deque()
        self._waiting = 0
        self._arrived = asyncio.Event()
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
        while self._groups:
            for _, future in self._groups.popleft().items:
                if not future.done():
                    future.set_exception(RuntimeError("the server is shutting down"))
        self._waiting = 0

    def retry_after_s(self) -> int:
        """About how many seconds the queue needs to drain (at least 1): the cost waiting × the model's measured
        seconds per unit of cost."""
        return max(1, math.ceil(self._waiting_cost * self._seconds_per_cost))

    async def submit_many(self, items: Sequence[Item]) -> list[tuple[Result, int]]:
        """Queue the items of one request, all or none (`QueueFull` when they do not fit); → for each,
        (its result, the size of the batch it ran in). If the caller stops waiting (cancelled: its
        deadline), its items not yet taken into a batch are withdrawn."""
        if self._groups is None:
            raise RuntimeError("MicroBatcher.submit_many before start()")
        if self._waiting + len(items) > self.max_queue:
            raise QueueFull(
                f"the server is busy: {self._waiting} questions are waiting for the model and this request "
                f"brings {len(items)} more; at most {self.max_queue} may wait (--max-queue)",
                self.retry_after_s(),
            )
        loop = asyncio.get_running_loop()
        group = _Request(deque((item, loop.create_future()) for item in items))
        group.light = sum(self.cost(item) for item in items) <= self.light_cost
        futures = [future for _, future in group.items]
        self._groups.append(group)
        for item, _ in group.items:
            self._count(group, item, +1)
        self._arrived.set()
        try:
            return list(await asyncio.gather(*futures))
        finally:  # cancelled, or one of its batches failed: what is still queued is withdrawn
            self._withdraw(group)
            for future in futures:
                future.cancel()  # a no-op for the ones done

    def _cost_cap(self, light: bool) -> float:
        """The most cost a batch takes now: `max_cost`; for a batch of heavy requests' items, also `max_seconds` of
        work at the measured pace (a light batch keeps the whole of `max_cost`: batching is what makes many light
        requests fast, and none waits behind it for long)."""
        if light or not self._seconds_per_cost:
            return self.max_cost
        return min(self.max_cost, self.max_seconds / self._seconds_per_cost)

    def _count(self, group: _Request, item: Item, sign: int) -> None:
        """Keep the waiting counts (items, their cost, light requests' items) as `item` of `group` joins (+1) or
        leaves (-1)."""
        self._waiting += sign
        self._waiting_cost += sign * self.cost(item)
        self._light_waiting += sign * group.light

    def _withdraw(self, group: _Request) -> None:
        for n, queued in enumerate(self._groups):
            if queued is group:
                del self._groups[n]
                for item, _ in group.items:
                    self._count(group, item, -1)
                return

    def _take(self, batch: list[tuple[Item, asyncio.Future]], cost: float, light: bool) -> float:
        """Move waiting items into `batch`, one per request in turn, while it has room (only light requests'
        items when `light`: heavy requests wait their turn); → its cost."""
        passed = 0  # requests looked at in a row without taking an item from them
        while self._groups and len(batch) < self.max_batch and passed < len(self._groups):
            group = self._groups[0]
            item, future = group.items[0]
            item_cost = self.cost(item)
            if future.cancelled():  # its caller gave up: drop it
                group.items.popleft()
                self._count(group, item, -1)
                passed = 0
            elif light and not group.light:
                passed += 1
            else:
                if batch and cost + item_cost > self._cost_cap(light):
                    break
                group.items.popleft()
                self._count(group, item, -1)
                batch.append((item, future))
                cost += item_cost
                passed = 0
            self._groups.popleft()
            if group.items:
                self._groups.append(group)  # its next item after one of every other request
        return cost

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            batch: list[tuple[Item, asyncio.Future]] = []
            light = self._light_waiting > 0  # light questions go first, in a batch of their own
            cost = self._take(batch, 0, light)
            deadline = loop.time() + max(self.window_s, FILL_FRACTION * self._last_run_s)
            while len(batch) < self.max_batch and cost < self._cost_cap(light) and not self._waiting:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except TimeoutError:  # what asyncio.wait_for raises from Python 3.11 on
                    break
                cost = self._take(batch, cost, light)
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
                pace = self._last_run_s / max(cost, 1)
                self._seconds_per_cost = (
                    pace if not self._seconds_per_cost else 0.7 * self._seconds_per_cost + 0.3 * pace
                )
            for (_, future), result in zip(live, results):
                if not future.done():
                    future.set_result((result, len(live)))
