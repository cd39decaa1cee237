"""Rollout servers killed for real (SIGKILL of the AsyncServer actor's process) while an
AgentLoopManager batch runs on two vLLM CPU engines (tiny-qwen3):

- one of two dies: its turns are re-sent to the other, the driver restarts it and hands the
  new actor (with the trainer's weights, via ``on_server_restart``) to every worker;
- every server dies: turns wait for the restarts, then finish;
- the restart budget is spent: the batch fails with a ``ServerRestartError`` saying what to do.

A killed server leaves no engine-core process behind (Ray's raylet ends a dead worker's
children; where nothing does, e.g. the raylet killed too, the core ends itself:
``servers/engine_watch.py``, tested in ``tests/integration/servers/test_serve_cli.py``).

Each batch must hold every sample (each uid ``n`` times) or fail explicitly.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import psutil
import pytest
import ray

from agentloop import AgentLoopManager, RolloutConfig
from agentloop.config import RecoveryConfig
from servers import ServerConfig, ServerGroup, ServerRestartError, stop_servers
from tests.shm import shm_entries

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy(minutes=5)]

N, PROMPTS, TOKENS = 2, 8, 192
PARAMS = {"temperature": 1.0, "max_tokens": TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def rollout(local_ray, tiny_qwen3_path):
    group = ServerGroup(
        ServerConfig(model=str(tiny_qwen3_path), max_model_len=512, http=False),
        2,
        max_restarts=3,
    )
    config = RolloutConfig(
        n=N,
        prompt_length=64,
        response_length=TOKENS,
        recovery=RecoveryConfig(health_check_interval_s=0.5, restart_wait_s=300),
    )
    manager = AgentLoopManager(config, group, str(tiny_qwen3_path))
    pushed: list[Any] = []
    manager.on_server_restart = pushed.extend
    yield group, manager, pushed
    manager.shutdown()
    stop_servers(group.handles)  # removes the shared memory of any that cannot stop cleanly


def _rows(tag: str) -> list[dict[str, Any]]:
    return [
        {"raw_prompt": [{"role": "user", "content": f"{tag} story {i}"}], "uid": f"{tag}-{i}"}
        for i in range(PROMPTS)
    ]


def _pid(handle: Any) -> int:
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))


def _in_flight(handle: Any) -> float:
    text = ray.get(handle.metrics_text.remote())
    line = next(x for x in text.splitlines() if x.startswith("agentloop_requests_in_flight "))
    return float(line.split()[1])


def _kill_when_busy(handles: list[Any]) -> threading.Thread:
    """SIGKILL each server's process once it has generate requests running."""
    pids = [_pid(h) for h in handles]

    def run() -> None:
        for handle, pid in zip(handles, pids, strict=True):
            deadline = time.monotonic() + 60
            while _in_flight(handle) < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _gone(procs: list[psutil.Process], timeout_s: float) -> bool:
    """Whether every process ended (a zombie has ended) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if all(p.status() == psutil.STATUS_ZOMBIE for p in procs):
                return True
        except psutil.NoSuchProcess:
            procs = [p for p in procs if p.is_running()]
            continue
        time.sleep(0.2)
    return False


def _assert_every_sample(batch: Any, tag: str) -> None:
    assert Counter(batch.uid) == {f"{tag}-{i}": N for i in range(PROMPTS)}
    # Every sample's response is complete: retried turns were generated again, not cut.
    assert batch.response_mask.sum(dim=1).tolist() == [TOKENS] * PROMPTS * N


def _shm(handle: Any) -> set[str]:
    return set(ray.get(handle.shm_footprint.remote())["names"])


def test_a_killed_server_has_its_turns_retried_elsewhere_and_is_restarted(rollout):
    group, manager, pushed = rollout
    victim = group.handles[1]
    # Each engine's /dev/shm entries: its engine-core process's semaphore (a one-rank CPU
    # engine runs its model in that process, so no message-queue segments to a worker).
    killed, kept = _shm(victim), _shm(group.handles[0])
    for names in (killed, kept):
        assert any(n.startswith("sem.") for n in names), names
    assert not killed & kept and (killed | kept) <= shm_entries()
    # its EngineCore (and multiprocessing's resource tracker, which ends when its pipe closes)
    engine = psutil.Process(_pid(victim)).children()
    assert any("EngineCore" in " ".join(p.cmdline()) for p in engine), engine
    killer = _kill_when_busy([victim])
    batch = manager.generate_sequences(_rows("a"), sampling_params=PARAMS)
    killer.join()
    _assert_every_sample(batch, "a")
    assert batch.metrics["rollout/requests_retried"] >= 1
    # The driver notices within a health-check interval (or at the next batch at the latest).
    deadline = time.monotonic() + 30
    while manager.server_restarts == 0 and time.monotonic() < deadline:
        manager.heal()
        time.sleep(0.5)
    assert manager.server_restarts == group.restarts == 1
    assert group.handles[1] is not victim and pushed == [group.handles[1]]
    # A SIGKILLed engine cannot unlink its shared memory: the group removed the killed
    # engine's entries on restart, and only those.
    entries = shm_entries()
    assert not killed & entries and kept <= entries
    # Its engine core is gone too (an orphan would keep its model and a core busy).
    assert _gone(engine, timeout_s=60), [(p.pid, p.status()) for p in engine if p.is_running()]
    # The new server takes work again.
    batch = manager.generate_sequences(_rows("b"), sampling_params=PARAMS)
    _assert_every_sample(batch, "b")
    assert ray.get(group.handles[1].health.remote())["backend"] == "vllm"
    assert _in_flight(group.handles[1]) == 0 and "agentloop_requests_total" in ray.get(
        group.handles[1].metrics_text.remote()
    )


def test_with_every_server_dead_turns_wait_for_the_restarts(rollout):
    group, manager, pushed = rollout
    before = manager.server_restarts
    victims = list(group.handles)
    killer = _kill_when_busy(victims)
    batch = manager.generate_sequences(_rows("c"), sampling_params=PARAMS)
    killer.join()
    _assert_every_sample(batch, "c")
    assert manager.server_restarts - before == 2
    assert batch.metrics["rollout/server_restarts"] == 2
    assert batch.metrics["rollout/requests_retried"] >= 2
    assert not set(group.handles) & set(victims)
    # both new servers were handed the weights; the order is the order the health checks
    # found the deaths (server 1 first in one CI run on a loaded machine), not their indices
    assert len(pushed[-2:]) == 2 and set(pushed[-2:]) == set(group.handles)


def test_a_death_past_the_restart_budget_fails_the_batch_clearly(rollout):
    group, manager, _ = rollout
    assert group.restarts == group.max_restarts == 3
    killer = _kill_when_busy([group.handles[0]])
    with pytest.raises(ServerRestartError) as err:
        manager.generate_sequences(_rows("d"), sampling_params=PARAMS)
    killer.join()
    assert str(err.value) == (
        "server 0 died and 3 restart(s) were already spent (max_restarts=3): look at the "
        "server's log (OOM kill? engine error?)"
    )
