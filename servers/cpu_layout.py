"""How a vLLM CPU engine lays out its processes and threads, set as the environment its
engine-core process inherits.

vLLM's CPU platform runs the model in a worker process of its own (the ``mp`` executor) below
the engine-core process, each spawned and importing vLLM afresh, and binds the worker's
OpenMP threads to all but one physical core. With one tensor-parallel rank we run the worker
inside the engine-core process instead (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` lets vLLM keep
its ``uni`` executor; ``AsyncLLM`` still runs the engine core in a process of its own): one
spawned interpreter less at every start. In the README's quick start on 2 cores the server
was ready 37.2 s after the command against 49.4 s (``tests/perf/test_bench_first_step.py``).
The thread count is set here (``OMP_NUM_THREADS``, which the ``mp`` executor sets for its
worker): one per given core (``cpu_cores``), else one per physical core of the process's
affinity.

A setting the user exported stands: ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` brings the worker
process back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MULTIPROCESSING_ENV", "engine_thread_count", "in_process_worker_env"]

MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _physical_cores(cpus: Iterable[int]) -> int:
    """Physical cores among logical ``cpus`` (SMT siblings count once); where the topology
    cannot be read, every logical CPU counts."""
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topo / "physical_package_id").read_text().strip()
            cores.add((package, (topo / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # its topology unread: the logical CPU alone
    return len(cores)


def engine_thread_count(cores: list[int] | None) -> int:
    """Threads the model runs on: one per given core (``cpu_cores``); otherwise one per
    physical core this process may run on. vLLM's own binding leaves one core to the
    scheduler's process; with the worker inside that process the scheduler runs between
    the model's steps, not beside them, so no core is left out."""
    if cores is not None:
        return len(cores)
    return max(1, _physical_cores(sorted(os.sched_getaffinity(0))))


def in_process_worker_env(tensor_parallel_size: int, cores: list[int] | None) -> dict[str, str]:
    """The variables to export before the engine starts so its one worker runs inside the
    engine-core process with ``engine_thread_count`` threads; none with several ranks or
    where the user asked for the worker process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``)."""
    if tensor_parallel_size != 1 or os.environ.get(MULTIPROCESSING_ENV, "0") != "0":
        return {}
    return {MULTIPROCESSING_ENV: "0", "OMP_NUM_THREADS": str(engine_thread_count(cores))}
