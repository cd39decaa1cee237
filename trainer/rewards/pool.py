"""Running a synchronous reward function for many samples at once, each call with a timeout.

``thread``: a thread pool (I/O-bound scorers, or ones that release the GIL). ``process``: a
pool of spawned processes that each load the function from its file once (CPU-bound scorers,
e.g. symbolic math); after a batch in which a call timed out, the pool's processes are
terminated and replaced, so a runaway scorer cannot pile up. A thread that timed out cannot be
stopped and keeps its slot until the call returns.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Literal

from trainer.rewards.rules import RewardFn, load_reward_function

__all__ = ["CallPool"]

logger = logging.getLogger(__name__)

_WORKER_FN: RewardFn | None = None


def _load_in_worker(path: str | None, name: str, key: str, field: str) -> None:
    global _WORKER_FN
    _WORKER_FN = load_reward_function(path, name, key, field)


def _call_in_worker(*args: Any) -> Any:
    assert _WORKER_FN is not None
    return _WORKER_FN(*args)


def _ping() -> int:
    time.sleep(0.05)  # busy long enough that the next ping needs another process
    return os.getpid()


class CallPool:
    """``await pool.map(jobs)``: the function applied to every job's arguments in parallel; a
    call that raises or times out yields its exception instead of a result."""

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
        self._executor = self._new_executor()

    def _new_executor(self) -> Executor:
        if self.kind == "thread":
            return ThreadPoolExecutor(self.workers, thread_name_prefix="reward")
        executor = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_load_in_worker,
            initargs=self.source,
        )
        # Start every process (and load the function) now, so that no call's timeout is
        # spent spawning a worker; a file that fails to load in a worker fails here.
        for future in [executor.submit(_ping) for _ in range(self.workers)]:
            future.result()
        return executor

    async def map(self, jobs: list[tuple[Any, ...]]) -> list[Any]:
        loop = asyncio.get_running_loop()
        # The timeout counts a call from when a worker takes it, not while it queues.
        slots = asyncio.Semaphore(self.workers)
        timed_out = False

        async def run(args: tuple[Any, ...]) -> Any:
            nonlocal timed_out
            async with slots:
                if self.kind == "process":
                    future = loop.run_in_executor(self._executor, _call_in_worker, *args)
                else:
                    future = loop.run_in_executor(self._executor, self.fn, *args)
                try:
                    return await asyncio.wait_for(future, self.timeout_s)
                except TimeoutError:
                    timed_out = True
                    return TimeoutError(f"timed out after {self.timeout_s:g} s")
                except Exception as exc:  # noqa: BLE001 - one bad sample must not end the step
                    return exc

        results = await asyncio.gather(*(run(j) for j in jobs))
        if timed_out and self.kind == "process":
            logger.warning("a reward call timed out: replacing the reward process pool")
            self._terminate()
            self._executor = await asyncio.to_thread(self._new_executor)
        return list(results)

    def _terminate(self) -> None:
        for process in list(getattr(self._executor, "_processes", {}).values()):
            process.terminate()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self.kind == "process":
            self._terminate()
        else:
            self._executor.shutdown(wait=False, cancel_futures=True)
