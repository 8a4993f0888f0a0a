"""`DelayQueue` for asyncio code (FastAPI, aiohttp, ...): the same calls as coroutines.

Each call runs the blocking one on a thread of the loop's default executor. The core
releases the GIL while it waits on Redis, so the event loop goes on serving requests
meanwhile, and concurrent calls overlap:

    queue = delayq.AsyncDelayQueue(delayq.DelayQueue(url, "orders"))
    msg_id = await queue.push({"order_id": 10086}, delay=1800)

The payload is converted to JSON on that thread: do not change it while the call runs.
Consumers stay `delayq.Worker` (its `run_async` runs coroutine handlers on a loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Optional, Union

from .records import DeadLetter, MessageInfo, Minute, RateLimit, RegisteredQueue, Repeat, Stats, WorkerInfo

from ._delayq import DelayQueue


class AsyncDelayQueue:
    """The producer and admin calls of `queue` as coroutines; see the module's text."""

    def __init__(self, queue: DelayQueue) -> None:
        if not isinstance(queue, DelayQueue):
            raise TypeError(f"AsyncDelayQueue wraps a delayq.DelayQueue, not {type(queue).__name__}")
        self._queue = queue

    @property
    def sync(self) -> DelayQueue:
        """The wrapped `DelayQueue`, for blocking calls."""
        return self._queue

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._queue.name

    async def push(self, payload: Any, delay: float = 0.0, *, id: Optional[str] = None,
                   max_attempts: Optional[int] = None, partition_key: Optional[str] = None,
                   replace: bool = False, expire_after: Optional[float] = None,
                   serial_key: Optional[str] = None, group: Optional[str] = None) -> str:
        """`DelayQueue.push`."""
        return await asyncio.to_thread(self._queue.push, payload, delay, id=id, max_attempts=max_attempts,
                                       partition_key=partition_key, replace=replace, expire_after=expire_after,
                                       serial_key=serial_key, group=group)

    async def push_at(self, payload: Any, at: Union[float, datetime], *, id: Optional[str] = None,
                      max_attempts: Optional[int] = None, partition_key: Optional[str] = None,
                      replace: bool = False, expire_after: Optional[float] = None,
                      serial_key: Optional[str] = None, group: Optional[str] = None) -> str:
        """`DelayQueue.push_at`."""
        return await asyncio.to_thread(self._queue.push_at, payload, at, id=id, max_attempts=max_attempts,
                                       partition_key=partition_key, replace=replace, expire_after=expire_after,
                                       serial_key=serial_key, group=group)

    async def push_many(self, items: Iterable[Union[tuple[Any, float], Mapping[str, Any]]]) -> list[str]:
        """`DelayQueue.push_many`: one round trip (two for 1 000 delays or more), nothing
        written unless all are valid; a batch of several scripts that fails part way
        raises `PartialPushError`, which names the ids written."""
        # A generator must not be consumed on the other thread while this one runs.
        return await asyncio.to_thread(self._queue.push_many, list(items))

    async def cancel(self, id: str, *, kill: bool = False) -> bool:
        """`DelayQueue.cancel`."""
        return await asyncio.to_thread(self._queue.cancel, id, kill=kill)

    async def reschedule(self, id: str, delay: float) -> bool:
        """`DelayQueue.reschedule`."""
        return await asyncio.to_thread(self._queue.reschedule, id, delay)

    async def get(self, id: str) -> Optional[MessageInfo]:
        """`DelayQueue.get`."""
        return await asyncio.to_thread(self._queue.get, id)

    async def stats(self) -> Stats:
        """`DelayQueue.stats`."""
        return await asyncio.to_thread(self._queue.stats)

    async def waiting(self, limit: int = 100, *, start: int = 0) -> list[MessageInfo]:
        """`DelayQueue.waiting`."""
        return await asyncio.to_thread(self._queue.waiting, limit, start=start)

    async def inflight(self, limit: int = 100, *, start: int = 0) -> list[MessageInfo]:
        """`DelayQueue.inflight`."""
        return await asyncio.to_thread(self._queue.inflight, limit, start=start)

    async def find(self, text: str, limit: int = 20) -> list[MessageInfo]:
        """`DelayQueue.find`."""
        return await asyncio.to_thread(self._queue.find, text, limit)

    async def find_field(
        self, field: str, value: Union[str, int, float, bool, None], limit: int = 20
    ) -> list[MessageInfo]:
        """`DelayQueue.find_field`."""
        return await asyncio.to_thread(self._queue.find_field, field, value, limit)

    async def completed(self, limit: int = 100, *, start: int = 0) -> list[MessageInfo]:
        """`DelayQueue.completed`."""
        return await asyncio.to_thread(self._queue.completed, limit, start=start)

    async def dead_letters(self, limit: int = 100, *, start: int = 0) -> list[DeadLetter]:
        """`DelayQueue.dead_letters`."""
        return await asyncio.to_thread(self._queue.dead_letters, limit, start=start)

    async def minutes(self, span: int = 60) -> list[Minute]:
        """`DelayQueue.minutes`."""
        return await asyncio.to_thread(self._queue.minutes, span)

    async def registered_queues(self) -> list[RegisteredQueue]:
        """`DelayQueue.registered_queues`."""
        return await asyncio.to_thread(self._queue.registered_queues)

    async def registered_queues_page(self, limit: int = 50, *, start: int = 0) -> tuple[list[RegisteredQueue], int]:
        """`DelayQueue.registered_queues_page`."""
        return await asyncio.to_thread(self._queue.registered_queues_page, limit, start=start)

    async def workers(self) -> list[WorkerInfo]:
        """`DelayQueue.workers`."""
        return await asyncio.to_thread(self._queue.workers)

    async def requeue_dead(self, id: Optional[str] = None) -> int:
        """`DelayQueue.requeue_dead`."""
        return await asyncio.to_thread(self._queue.requeue_dead, id)

    async def delete_dead(self, id: Optional[str] = None) -> int:
        """`DelayQueue.delete_dead`."""
        return await asyncio.to_thread(self._queue.delete_dead, id)

    async def requeue_dead_with_error(self, text: str) -> int:
        """`DelayQueue.requeue_dead_with_error`."""
        return await asyncio.to_thread(self._queue.requeue_dead_with_error, text)

    async def delete_dead_with_error(self, text: str) -> int:
        """`DelayQueue.delete_dead_with_error`."""
        return await asyncio.to_thread(self._queue.delete_dead_with_error, text)

    async def repeat(self, name: str, schedule: Union[str, float], payload: Any, *, tz: Optional[str] = None,
                     max_attempts: Optional[int] = None, expire_after: Optional[float] = None) -> float:
        """`DelayQueue.repeat`."""
        return await asyncio.to_thread(self._queue.repeat, name, schedule, payload, tz=tz, max_attempts=max_attempts,
                                       expire_after=expire_after)

    async def unrepeat(self, name: str) -> bool:
        """`DelayQueue.unrepeat`."""
        return await asyncio.to_thread(self._queue.unrepeat, name)

    async def repeats(self) -> list[Repeat]:
        """`DelayQueue.repeats`."""
        return await asyncio.to_thread(self._queue.repeats)

    async def pause(self) -> bool:
        """`DelayQueue.pause`."""
        return await asyncio.to_thread(self._queue.pause)

    async def resume(self) -> bool:
        """`DelayQueue.resume`."""
        return await asyncio.to_thread(self._queue.resume)

    async def is_paused(self) -> bool:
        """`DelayQueue.is_paused`."""
        return await asyncio.to_thread(self._queue.is_paused)

    async def set_rate_limit(self, max: int, per: float = 1.0) -> None:
        """`DelayQueue.set_rate_limit`."""
        await asyncio.to_thread(self._queue.set_rate_limit, max, per)

    async def set_group_limit(self, group: Optional[str], *, concurrency: Optional[int] = None,
                              max: Optional[int] = None, per: Optional[float] = None) -> bool:
        """`DelayQueue.set_group_limit`."""
        return await asyncio.to_thread(self._queue.set_group_limit, group, concurrency=concurrency, max=max,
                                       per=per)

    async def clear_rate_limit(self) -> bool:
        """`DelayQueue.clear_rate_limit`."""
        return await asyncio.to_thread(self._queue.clear_rate_limit)

    async def rate_limit(self) -> Optional[RateLimit]:
        """`DelayQueue.rate_limit`."""
        return await asyncio.to_thread(self._queue.rate_limit)

    async def restart_workers(self) -> int:
        """`DelayQueue.restart_workers`."""
        return await asyncio.to_thread(self._queue.restart_workers)

    async def move_waiting(self, to: Union[DelayQueue, AsyncDelayQueue]) -> int:
        """`DelayQueue.move_waiting`."""
        target = to.sync if isinstance(to, AsyncDelayQueue) else to
        return await asyncio.to_thread(self._queue.move_waiting, target)

    async def purge(self) -> int:
        """`DelayQueue.purge`."""
        return await asyncio.to_thread(self._queue.purge)

    async def ping(self) -> bool:
        """`DelayQueue.ping`."""
        return await asyncio.to_thread(self._queue.ping)
