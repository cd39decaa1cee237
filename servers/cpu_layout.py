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

An eager CPU engine also runs vLLM's few ``torch.compile``-wrapped sampler helpers eagerly
(``TORCHDYNAMO_DISABLE=1``, ``eager_cpu_env``): with the engine's temp dir a fresh folder,
inductor compiled their C++ from a cold cache at every start (the shared tiny server's module
took 48.5 s against 35.9 s for the same two tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "DYNAMO_ENV",
    "MULTIPROCESSING_ENV",
    "eager_cpu_env",
    "engine_thread_count",
    "in_process_worker_env",
]

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


DYNAMO_ENV = "TORCHDYNAMO_DISABLE"


def eager_cpu_env(cpu: bool, eager: bool) -> dict[str, str]:
    """``TORCHDYNAMO_DISABLE=1`` for an eager CPU engine: vLLM still wraps a few sampler
    helpers in ``torch.compile`` (the rank of each sampled token's log-prob among the
    vocabulary, top-k/top-p), and the engine's temp dir is a fresh folder of its own
    (``servers/scratch.py``), so inductor's cache starts cold at every start: a C++ compile of
    its headers and kernels, 8-9 s of CPU per engine start on 2 cores, for work that runs in
    milliseconds eagerly. None on GPUs, with the model compiled, or where the user set it."""
    if not (cpu and eager) or DYNAMO_ENV in os.environ:
        return {}
    return {DYNAMO_ENV: "1"}
