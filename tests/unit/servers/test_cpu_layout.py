"""Where a vLLM CPU engine's model runs and on how many threads (servers/cpu_layout.py); the
integration test of the server checks the engine it starts reports the ``uni`` executor."""

from __future__ import annotations

import os

import pytest

from servers.cpu_layout import (
    DYNAMO_ENV,
    MULTIPROCESSING_ENV,
    eager_cpu_env,
    engine_thread_count,
    in_process_worker_env,
)


def test_one_rank_runs_its_worker_in_the_engine_core_with_a_thread_per_given_core(monkeypatch):
    monkeypatch.delenv(MULTIPROCESSING_ENV, raising=False)
    assert in_process_worker_env(1, [0, 1, 3]) == {
        MULTIPROCESSING_ENV: "0",
        "OMP_NUM_THREADS": "3",
    }


def test_without_given_cores_every_physical_core_of_the_affinity_gets_a_thread(monkeypatch):
    monkeypatch.delenv(MULTIPROCESSING_ENV, raising=False)
    threads = engine_thread_count(None)
    assert 1 <= threads <= len(os.sched_getaffinity(0))
    assert in_process_worker_env(1, None)["OMP_NUM_THREADS"] == str(threads)


@pytest.mark.parametrize(("ranks", "exported"), [(2, None), (1, "1")])
def test_several_ranks_or_a_users_setting_keep_vllms_worker_processes(monkeypatch, ranks, exported):
    if exported is None:
        monkeypatch.delenv(MULTIPROCESSING_ENV, raising=False)
    else:
        monkeypatch.setenv(MULTIPROCESSING_ENV, exported)
    assert in_process_worker_env(ranks, [0, 1]) == {}


def test_an_eager_cpu_engine_runs_torch_compile_eagerly_unless_the_user_says(monkeypatch):
    monkeypatch.delenv(DYNAMO_ENV, raising=False)
    assert eager_cpu_env(cpu=True, eager=True) == {DYNAMO_ENV: "1"}
    assert eager_cpu_env(cpu=True, eager=False) == {}  # a compiled model keeps dynamo
    assert eager_cpu_env(cpu=False, eager=True) == {}
    monkeypatch.setenv(DYNAMO_ENV, "0")
    assert eager_cpu_env(cpu=True, eager=True) == {}
