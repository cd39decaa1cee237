"""``servers.inflight`` against a scripted engine (the real vLLM engine runs it in
``tests/integration/servers/test_vllm_server.py``): the order of the engine calls around a
load, each running request's token count taken after the pause, and the KV switch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from servers.inflight import InFlight, sampled_so_far


class ScriptedEngine:
    """What ``InFlight`` calls, recorded; two requests known to the output processor (``a``
    with 5 tokens sampled, ``b`` with 2), ``c`` not yet."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        tokens = {"a-0": 5, "b-0": 2}
        self.output_processor = SimpleNamespace(
            external_req_ids={"a": ["a-0"], "b": ["b-0"]},
            request_states={
                rid: SimpleNamespace(detokenizer=SimpleNamespace(num_output_tokens=lambda n=n: n))
                for rid, n in tokens.items()
            },
        )

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        self.calls.append(("pause", mode, clear_cache))

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append(("reset", reset_running_requests))
        return True


@pytest.mark.parametrize("recompute", [False, True])
async def test_a_load_under_running_requests_pauses_keeps_counts_and_resumes(recompute):
    engine, inflight = ScriptedEngine(), InFlight(recompute_kv=recompute)
    swaps = {rid: inflight.start(rid) for rid in ("a", "b", "c")}
    async with inflight.loading(engine):
        engine.calls.append(("load",))
    assert engine.calls == [
        ("pause", "keep", False),  # the running requests stay, their KV cache too
        ("load",),
        ("reset", recompute),  # recompute: the running ones are preempted and prefill again
        ("resume",),
    ]
    assert swaps == {"a": [5], "b": [2], "c": [0]} and inflight.kept == 3
    inflight.end("a")
    assert "a" not in inflight.live


async def test_a_load_with_nothing_running_resets_the_cache_without_pausing():
    engine, inflight = ScriptedEngine(), InFlight(recompute_kv=True)
    async with inflight.loading(engine):
        engine.calls.append(("load",))
    assert engine.calls == [("load",), ("reset", False)] and inflight.kept == 0


async def test_a_failed_load_still_resumes_the_engine():
    engine, inflight = ScriptedEngine(), InFlight()
    inflight.start("a")
    with pytest.raises(RuntimeError, match="bad bucket"):
        async with inflight.loading(engine):
            raise RuntimeError("bad bucket")
    assert engine.calls == [("pause", "keep", False), ("resume",)]


def test_tokens_so_far_are_the_output_processors_count():
    engine = ScriptedEngine()
    assert [sampled_so_far(engine, rid) for rid in ("a", "b", "unknown")] == [5, 2, 0]
