"""Running a synchronous reward function for many samples at once, each call with a timeout.

The timeout counts a call from when a worker starts it, not while it waits for one.

``thread``: a thread pool (I/O-bound scorers, or ones that release the GIL). A thread cannot be
stopped, so a call that timed out keeps its worker counted as busy until it really returns:
later calls wait for a free worker instead of queueing behind it and timing out unserved. A
call still running at ``HUNG_AFTER`` x its timeout counts as hung; when every worker holds a
hung call, waiting calls fail at once (``executor=process`` is the cure: its workers can be
killed).

``process``: a ``pebble`` process pool of spawned workers that each load the function from its
file once (CPU-bound scorers, e.g. symbolic math); a call that times out has its worker killed
and replaced, so a runaway scorer cannot pile up.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from pebble import ProcessPool

from trainer.rewards.rules import RewardFn, load_reward_function

__all__ = ["HUNG_AFTER", "CallPool"]

logger = logging.getLogger(__name__)

HUNG_AFTER = 3.0
"""A timed-out thread call still running at this multiple of the timeout counts as hung."""

_WORKER_FN: RewardFn | None = None


def _load_in_worker(path: str | None, name: str, key: str, field: str) -> None:
    global _WORKER_FN
    _WORKER_FN = load_reward_function(path, name, key, field)


def _call_in_worker(**kwargs: Any) -> Any:
    assert _WORKER_FN is not None
    return _WORKER_FN(**kwargs)


def _ping() -> int:
    time.sleep(0.05)  # busy long enough that the next ping needs another process
    return os.getpid()


class _Overrun:
    """A thread call that timed out and still runs: it holds a worker until it returns."""

    __slots__ = ("future", "started")

    def __init__(self, future: concurrent.futures.Future[Any], started: float) -> None:
        self.future = future
        self.started = started


class _Slots:
    """Free workers, shared by every ``map`` on any event loop; given back from the worker
    thread when a call returns, handed straight to the oldest waiter."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = (
            collections.deque()
        )
        self._lock = threading.Lock()

    async def take(self, poll_s: float, give_up: Callable[[], bool]) -> bool:
        """Wait for a free worker; False (no slot taken) if ``give_up()`` holds at a poll."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return True
            granted: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, granted))
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(granted), poll_s)
                return True
            except TimeoutError:
                if not give_up():
                    continue
                with self._lock:
                    if granted.done():  # handed over meanwhile
                        return True
                    if (loop, granted) in self._waiters:
                        self._waiters.remove((loop, granted))
                    granted.cancel()  # a grant already on its way is passed on
                return False

    def give(self) -> None:
        """One worker free again (any thread)."""
        with self._lock:
            while self._waiters:
                loop, granted = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, granted)
                    return
                except RuntimeError:  # that waiter's loop has closed
                    continue
            self._free += 1

    def _grant(self, granted: asyncio.Future[None]) -> None:
        if granted.done():  # the waiter gave up first: pass the slot on
            self.give()
        else:
            granted.set_result(None)


class CallPool:
    """``await pool.map(jobs)``: the function called with every job's keyword arguments in
    parallel; a call that raises or times out yields its exception instead of a result."""

    def __init__(
        self,
        fn: RewardFn,
        *,
        workers: int,
        timeout_s: float,
        kind: Literal["thread", "process"] = "thread",
        source: tuple[str | None, str, str, str] = (
            None,
            "compute_score",
            "custom_reward_function",
            "name",
        ),
    ) -> None:
        self.fn = fn
        self.workers = workers
        self.timeout_s = timeout_s
        self.kind = kind
        self.source = source
        """``(path, name, config key, name key)`` a process worker loads the function from."""
        self._overruns: list[_Overrun] = []
        self._slots = _Slots(workers)
        self._lock = threading.Lock()
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._processes: ProcessPool | None = None
        if kind == "thread":
            self._threads = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="reward"
            )
        else:
            self._processes = self._new_process_pool()

    def _new_process_pool(self) -> ProcessPool:
        pool = ProcessPool(
            max_workers=self.workers,
            initializer=_load_in_worker,
            initargs=self.source,
            context=multiprocessing.get_context("spawn"),
        )
        # Start every process (and load the function) now, so that no call's timeout is
        # spent spawning a worker; a file that fails to load in a worker fails here.
        for future in [pool.schedule(_ping) for _ in range(self.workers)]:
            future.result()
        return pool

    async def map(self, jobs: list[dict[str, Any]]) -> list[Any]:
        if self._processes is not None:
            return list(await asyncio.gather(*(self._in_process(j) for j in jobs)))
        return await self._in_threads(jobs)

    async def _in_process(self, kwargs: dict[str, Any]) -> Any:
        assert self._processes is not None
        # pebble starts the clock when a worker takes the call and, past it, kills that worker
        # and starts a fresh one.
        future = self._processes.schedule(_call_in_worker, kwargs=kwargs, timeout=self.timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except TimeoutError:
            logger.warning("a reward call timed out: its process worker was replaced")
            return TimeoutError(f"timed out after {self.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - one bad sample must not end the step
            return exc

    async def _in_threads(self, jobs: list[dict[str, Any]]) -> list[Any]:
        return list(await asyncio.gather(*(self._in_thread(j) for j in jobs)))

    async def _in_thread(self, kwargs: dict[str, Any]) -> Any:
        assert self._threads is not None
        if not await self._slots.take(self.timeout_s, self._all_hung):
            return TimeoutError(
                f"not run: all {self.workers} reward threads are still running calls that "
                f"timed out over {HUNG_AFTER:g} x {self.timeout_s:g} s ago; use "
                "custom_reward_function.executor=process so hung calls are killed"
            )
        started = time.monotonic()
        future = self._threads.submit(self.fn, **kwargs)
        future.add_done_callback(lambda _: self._slots.give())  # when the call really ends
        try:
            # shield: on timeout only the wait ends; the thread runs on, holding its slot
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), self.timeout_s
            )
        except TimeoutError:
            with self._lock:
                self._overruns = [o for o in self._overruns if not o.future.done()]
                self._overruns.append(_Overrun(future, started))
            logger.warning(
                "a reward call timed out after %g s; its thread keeps a worker until the call "
                "returns",
                self.timeout_s,
            )
            return TimeoutError(f"timed out after {self.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - one bad sample must not end the step
            return exc

    def _all_hung(self) -> bool:
        limit = time.monotonic() - HUNG_AFTER * self.timeout_s
        with self._lock:
            running = [o for o in self._overruns if not o.future.done()]
        return len(running) >= self.workers and all(o.started < limit for o in running)

    def close(self) -> None:
        if self._processes is not None:
            self._processes.stop()
            self._processes.join(timeout=10)
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
