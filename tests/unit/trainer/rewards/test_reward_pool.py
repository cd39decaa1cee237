"""``CallPool`` with real threads and real spawned processes: the timeout counts a call from
when a worker starts it; a thread call that timed out keeps its worker until it returns (so
the next call is served on time, not timed out in a queue); a process call that timed out has
its worker killed and replaced; reward functions are called by keyword."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import psutil

from trainer.rewards.pool import HUNG_AFTER, CallPool


def timed_map(pool: CallPool, jobs: list[dict]) -> list[tuple[object, float]]:
    """Each job's result and the seconds from the start of the map to its end."""

    async def main() -> list[tuple[object, float]]:
        start = time.monotonic()

        async def one(job: dict) -> tuple[object, float]:
            (result,) = await pool.map([job])
            return result, time.monotonic() - start

        return list(await asyncio.gather(*(one(j) for j in jobs)))

    return asyncio.run(main())


def sleeper(seconds: float, value: str) -> str:
    time.sleep(seconds)
    return value


def test_a_timed_out_thread_keeps_its_worker_and_the_next_call_is_served_on_time():
    # The probe: 1 worker, timeout 1 s, calls of 2.0 s and 0.1 s. Before the fix both
    # returned TimeoutError at 2.0 s: the slot was freed at 1 s while the thread ran on.
    pool = CallPool(sleeper, workers=1, timeout_s=1.0)
    try:
        (slow, t_slow), (fast, t_fast) = timed_map(
            pool, [{"seconds": 2.0, "value": "slow"}, {"seconds": 0.1, "value": "fast"}]
        )
    finally:
        pool.close()
    assert isinstance(slow, TimeoutError) and str(slow) == "timed out after 1 s"
    assert 0.9 < t_slow < 1.5
    assert fast == "fast", f"the second call was not served: {fast!r}"
    assert 2.0 <= t_fast < 2.6, f"served at {t_fast:.2f} s; its worker was free at 2.0 s"


def test_a_thread_that_timed_out_in_one_step_still_holds_its_worker_in_the_next():
    pool = CallPool(sleeper, workers=1, timeout_s=0.5)
    try:
        (first,) = asyncio.run(pool.map([{"seconds": 1.5, "value": "slow"}]))
        assert isinstance(first, TimeoutError)
        start = time.monotonic()
        (second,) = asyncio.run(pool.map([{"seconds": 0.1, "value": "next"}]))
        waited = time.monotonic() - start
    finally:
        pool.close()
    # The next step's call waits for the thread (about 1 s more), then runs within its budget.
    assert second == "next" and 0.8 < waited < 1.6


def test_when_every_thread_holds_a_hung_call_waiting_calls_fail_at_once_saying_what_to_do():
    release = threading.Event()

    def fn(hang: bool) -> str:
        if hang:
            release.wait(30)
        return "ok"

    pool = CallPool(fn, workers=1, timeout_s=0.2)
    try:
        (hung,) = asyncio.run(pool.map([{"hang": True}]))
        start = time.monotonic()
        (refused,) = asyncio.run(pool.map([{"hang": False}]))
        waited = time.monotonic() - start
    finally:
        release.set()
        pool.close()
    assert isinstance(hung, TimeoutError)
    assert isinstance(refused, TimeoutError)
    assert str(refused) == (
        f"not run: all 1 reward threads are still running calls that timed out over "
        f"{HUNG_AFTER:g} x 0.2 s ago; use custom_reward_function.executor=process so hung "
        "calls are killed"
    )
    assert waited < HUNG_AFTER * 0.2 + 0.5


REWARD_FILE = """
import os, time
from pathlib import Path

def compute_score(solution_str, extra_info, ground_truth, data_source):
    # parameters in another order than verl's: keyword calls fill them right
    Path(extra_info["pid_file"]).write_text(str(os.getpid()))
    time.sleep(float(solution_str))
    return f"{data_source}:{ground_truth}"
"""


def process_pool(tmp_path: Path, timeout_s: float, workers: int = 1) -> CallPool:
    path = tmp_path / "reward.py"
    path.write_text(REWARD_FILE)
    return CallPool(
        print,  # unused in process mode: workers load the file
        workers=workers,
        timeout_s=timeout_s,
        kind="process",
        source=(str(path), "compute_score", "custom_reward_function", "name"),
    )


def job(tmp_path: Path, seconds: float, name: str) -> dict:
    info = {"pid_file": str(tmp_path / f"{name}.pid")}
    return {
        "data_source": "src",
        "solution_str": str(seconds),
        "ground_truth": name,
        "extra_info": info,
    }


def test_a_hung_process_worker_is_killed_and_replaced_and_the_next_call_is_served(tmp_path):
    pool = process_pool(tmp_path, timeout_s=1.0)
    try:
        (hung, t_hung), (fast, t_fast) = timed_map(
            pool, [job(tmp_path, 60, "hung"), job(tmp_path, 0.1, "fast")]
        )
        hung_pid = int((tmp_path / "hung.pid").read_text())
        fast_pid = int((tmp_path / "fast.pid").read_text())
        (again,) = asyncio.run(pool.map([job(tmp_path, 0.0, "again")]))
    finally:
        pool.close()
    assert isinstance(hung, TimeoutError) and str(hung) == "timed out after 1 s"
    assert 0.9 < t_hung < 2.0
    assert not psutil.pid_exists(hung_pid) or psutil.Process(hung_pid).status() == "zombie"
    assert fast == "src:fast" and fast_pid != hung_pid, "the call ran in a fresh worker"
    assert t_fast < 1.0 + 10.0  # after a respawn, well within its own 1 s once started
    assert again == "src:again"


def test_process_workers_score_in_parallel(tmp_path):
    pool = process_pool(tmp_path, timeout_s=5.0, workers=4)
    try:
        asyncio.run(pool.map([job(tmp_path, 0.0, f"w{i}") for i in range(4)]))  # warm
        start = time.monotonic()
        results = asyncio.run(pool.map([job(tmp_path, 0.5, f"p{i}") for i in range(4)]))
        elapsed = time.monotonic() - start
    finally:
        pool.close()
    assert results == [f"src:p{i}" for i in range(4)]
    assert elapsed < 1.5, f"4 x 0.5 s calls in 4 processes took {elapsed:.2f} s"


def test_close_stops_the_process_workers(tmp_path):
    pool = process_pool(tmp_path, 5.0, workers=2)
    asyncio.run(pool.map([job(tmp_path, 0.3, f"c{i}") for i in range(2)]))
    workers = {int((tmp_path / f"c{i}.pid").read_text()) for i in range(2)}
    assert len(workers) == 2
    pool.close()
    _, alive = psutil.wait_procs([psutil.Process(p) for p in workers if psutil.pid_exists(p)], 10)
    assert not alive, f"workers still running after close: {alive}"
