"""AsyncLLMServerManager routing with in-process fake servers (scripted latencies)."""

from __future__ import annotations

import asyncio

import pytest

from servers import AsyncLLMServerManager, EngineDeadError, NoHealthyServerError, TokenOutput
from servers.types import GenerateRequest, SamplingParams

DELAYS: dict[str, float] = {}
"""Seconds a ``FakeServer`` takes for each session's turn (set by ``req``)."""


def req(session_id: str, prompt_ids: list[int], params: dict) -> GenerateRequest:
    """A turn of ``session_id``; a ``delay`` in ``params`` is the fake servers' latency."""
    params = dict(params)
    DELAYS[session_id] = params.pop("delay", 0.01)
    return GenerateRequest(
        prompt_ids=prompt_ids,
        sampling_params=SamplingParams.from_dict(params),
        session_id=session_id,
    )


class FakeServer:
    """Answers after ``delay(prompt_ids)`` seconds; records what it served."""

    def __init__(self, name: str, dead: bool = False) -> None:
        self.name = name
        self.dead = dead
        self.seen: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.aborted: list[str] = []

    async def generate(self, request):
        if self.dead:
            raise EngineDeadError(f"{self.name} is dead")
        self.seen.append(request.request_id)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(DELAYS.get(request.session_id, 0.01))
        finally:
            self.in_flight -= 1
        return TokenOutput(token_ids=[1, 2, 3], log_probs=[-0.1] * 3, finish_reason="stop")

    async def abort(self, request_id):
        self.aborted.append(request_id)


async def test_first_turns_go_to_the_server_with_fewest_in_flight():
    a, b = FakeServer("a"), FakeServer("b")
    manager = AsyncLLMServerManager([a, b])
    # One very long request lands on a; every later short request must avoid a while it runs.
    long = asyncio.ensure_future(manager.generate(req("long", [1], {"delay": 0.5})))
    await asyncio.sleep(0.01)
    for i in range(10):
        await manager.generate(req(f"short-{i}", [1], {"delay": 0.01}))
    await long
    assert len(a.seen) == 1 and len(b.seen) == 10


async def test_uneven_lengths_balance_in_flight_not_counts():
    servers = [FakeServer(str(i)) for i in range(3)]
    manager = AsyncLLMServerManager(servers)
    delays = [0.2 if i % 4 == 0 else 0.02 for i in range(60)]

    async def one(i):
        await manager.generate(req(f"t{i}", [1], {"delay": delays[i]}))
        await asyncio.sleep(0)

    await asyncio.gather(*[one(i) for i in range(60)])
    assert all(s["in_flight"] == 0 for s in manager.stats())
    assert sum(s["requests"] for s in manager.stats()) == 60
    # In-flight balancing keeps concurrent load within one request of each other.
    assert max(s.max_in_flight for s in servers) - min(s.max_in_flight for s in servers) <= 1


async def test_later_turns_of_a_trajectory_stick_to_their_server_with_fresh_engine_ids():
    a, b = FakeServer("a"), FakeServer("b")
    manager = AsyncLLMServerManager([a, b])
    await manager.generate(req("traj-1", [1], {}))
    first = manager.server_for("traj-1")
    busy = asyncio.ensure_future(  # make the sticky server the busier one
        manager.generate(req("other", [1], {"delay": 0.3}))
    )
    await asyncio.sleep(0.01)
    for _ in range(3):
        await manager.generate(req("traj-1", [1, 2], {}))
    await busy
    server = [a, b][first]
    traj_ids = [rid for rid in server.seen if rid.startswith("traj-1-")]
    assert len(traj_ids) == 4 and len(set(traj_ids)) == 4


async def test_sticky_map_is_an_lru_of_bounded_size():
    manager = AsyncLLMServerManager([FakeServer("a")], max_sticky=5)
    for i in range(8):
        await manager.generate(req(f"t{i}", [1], {}))
    assert manager.server_for("t0") is None and manager.server_for("t7") == 0


async def test_dead_server_is_marked_and_the_request_retried_elsewhere():
    dead, alive = FakeServer("dead", dead=True), FakeServer("alive")
    manager = AsyncLLMServerManager([dead, alive])
    out = await manager.generate(req("t", [1], {}))
    assert out.token_ids == [1, 2, 3]
    stats = manager.stats()
    assert stats[0]["healthy"] is False and stats[0]["failures"] == 1
    assert stats[1]["requests"] == 1
    # The dead server is not tried again.
    await manager.generate(req("t2", [1], {}))
    assert manager.stats()[0]["requests"] == 1


async def test_all_servers_dead_raises_a_clear_error():
    manager = AsyncLLMServerManager([FakeServer("a", dead=True), FakeServer("b", dead=True)])
    with pytest.raises(
        NoHealthyServerError, match=r"no healthy server left for request t \(2 of 2 dead\)"
    ):
        await manager.generate(req("t", [1], {}))


async def test_with_no_server_left_a_turn_waits_for_a_replacement_and_runs_there():
    only = FakeServer("only", dead=True)
    manager = AsyncLLMServerManager([only], restart_wait_s=5)
    turn = asyncio.create_task(manager.generate(req("t", [1], {})))
    await asyncio.sleep(0.2)
    assert not turn.done() and manager.stats()[0]["healthy"] is False
    restarted = FakeServer("restarted")
    manager.replace_server(0, restarted)
    out = await asyncio.wait_for(turn, 2)
    assert out.token_ids == [1, 2, 3] and restarted.seen[0].startswith("t-")
    assert manager.retried_requests == 1 and manager.stats()[0]["healthy"] is True


async def test_a_turn_waiting_past_restart_wait_s_fails_with_the_clear_error():
    manager = AsyncLLMServerManager([FakeServer("a", dead=True)], restart_wait_s=0.2)
    with pytest.raises(NoHealthyServerError, match=r"\(1 of 1 dead\)"):
        await manager.generate(req("t", [1], {}))


async def test_a_late_failure_of_a_replaced_actor_leaves_its_replacement_healthy():
    class DiesLate(FakeServer):
        async def generate(self, request):
            await asyncio.sleep(0.2)
            raise EngineDeadError("old actor")

    new = FakeServer("new")
    manager = AsyncLLMServerManager([DiesLate("old")])
    turn = asyncio.create_task(manager.generate(req("t", [1], {})))
    await asyncio.sleep(0.05)
    manager.replace_server(0, new)
    out = await asyncio.wait_for(turn, 2)
    assert out.token_ids == [1, 2, 3] and manager.stats()[0]["healthy"] is True


async def test_bad_input_is_not_retried():
    class Rejecting(FakeServer):
        async def generate(self, request):
            self.seen.append(request.request_id)
            raise ValueError("prompt_ids is empty: send at least one token id")

    a, b = Rejecting("a"), Rejecting("b")
    manager = AsyncLLMServerManager([a, b])
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        await manager.generate(req("t", [], {}))
    assert len(a.seen) + len(b.seen) == 1
    assert all(s["healthy"] for s in manager.stats())


async def test_abort_reaches_the_running_engine_request():
    a = FakeServer("a")
    manager = AsyncLLMServerManager([a])
    task = asyncio.ensure_future(manager.generate(req("t", [1], {"delay": 0.2})))
    await asyncio.sleep(0.02)
    assert await manager.abort("t") is True
    await task
    assert a.aborted == a.seen
    assert await manager.abort("t") is False


def test_manager_needs_a_server():
    with pytest.raises(ValueError, match="at least one server"):
        AsyncLLMServerManager([])


class StreamingFakeServer:
    """Samples one token (id = its count so far) every 10 ms up to max_tokens; an abort ends
    the request with the tokens so far and finish_reason ``abort``, as vLLM does."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []
        self._aborted: set[str] = set()

    async def generate(self, request):
        prompt_ids = request.prompt_ids
        self.requests.append(list(prompt_ids))
        tokens: list[int] = []
        while len(tokens) < request.sampling_params.max_tokens:
            if request.request_id in self._aborted:
                return TokenOutput(tokens, [-1.0] * len(tokens), "abort")
            await asyncio.sleep(0.01)
            tokens.append(len(prompt_ids) + len(tokens))
        return TokenOutput(tokens, [-1.0] * len(tokens), "length")

    async def abort(self, request_id):
        self._aborted.add(request_id)


async def test_pause_with_abort_continues_the_turn_from_its_tokens_under_the_new_version():
    server = StreamingFakeServer()
    manager = AsyncLLMServerManager([server])
    task = asyncio.ensure_future(manager.generate(req("t", [100, 101], {"max_tokens": 20})))
    await asyncio.sleep(0.06)
    assert await manager.pause(abort=True) == 1
    held = asyncio.ensure_future(manager.generate(req("u", [7], {"max_tokens": 2})))
    await asyncio.sleep(0.05)
    assert not task.done() and not held.done() and len(server.requests) == 1  # both held
    manager.resume(1)
    out, other = await task, await held
    assert out.token_ids == list(range(2, 22)) and out.finish_reason == "length"
    k = out.versions.count(0)
    assert 0 < k < 20 and out.versions == [0] * k + [1] * (20 - k)
    assert server.requests[1][:2] == [100, 101] and len(server.requests[1]) == 2 + k
    assert other.versions == [1, 1] and manager.resumed_turns == 1
    assert manager.reprefilled_tokens == 2 + k  # the continuation's context, sent again


class SwappingFakeServer(StreamingFakeServer):
    """Loads weights under running requests, as ``servers.inflight`` does: each running
    request's token count at the load comes back in its ``weight_swaps``."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, list[int]] = {}
        self.swaps: dict[str, list[int]] = {}

    async def generate(self, request):
        tokens = self.live[request.request_id] = []
        swaps = self.swaps[request.request_id] = []
        while len(tokens) < request.sampling_params.max_tokens:
            await asyncio.sleep(0.01)
            tokens.append(len(tokens))
        del self.live[request.request_id]
        return TokenOutput(tokens, [-1.0] * len(tokens), "length", weight_swaps=swaps or None)

    def load(self) -> None:
        for rid, tokens in self.live.items():
            self.swaps[rid].append(len(tokens))


async def test_in_flight_updates_keep_turns_running_and_stamp_each_tokens_version():
    """``pause(keep=True)`` returns at once with the turns kept; each update that lands under
    a turn switches its stamps at the engine's count, to that update's version (versions may
    jump: a push every few steps); a turn that ends before the update's resume waits for its
    version; new turns wait at the gate."""
    server = SwappingFakeServer()
    manager = AsyncLLMServerManager([server])
    long = asyncio.ensure_future(manager.generate(req("t", [1], {"max_tokens": 30})))
    short = asyncio.ensure_future(manager.generate(req("s", [2], {"max_tokens": 6})))
    await asyncio.sleep(0.04)
    assert await manager.pause(keep=True) == 2
    held = asyncio.ensure_future(manager.generate(req("u", [7], {"max_tokens": 2})))
    server.load()
    await asyncio.sleep(0.1)  # the short turn ends before the update's resume
    assert not short.done() and not held.done()  # waits for its stamps; new turns held
    manager.resume(3)
    out_short, out_new = await short, await held
    await asyncio.sleep(0.04)
    assert await manager.pause(keep=True) == 1
    server.load()
    manager.resume(4)
    out = await long
    (a,), (b, c) = server.swaps[_rid(server, "s")], server.swaps[_rid(server, "t")]
    assert 0 < a < 6 and out_short.versions == [0] * a + [3] * (6 - a)
    assert 0 < b < c < 30 and out.versions == [0] * b + [3] * (c - b) + [4] * (30 - c)
    assert out_new.versions == [3, 3] and out.finish_reason == "length"
    assert (manager.kept_turns, manager.resumed_turns, manager.reprefilled_tokens) == (2, 0, 0)
    assert len(server.swaps) == 3  # three engine requests: none was sent again


def _rid(server: SwappingFakeServer, session: str) -> str:
    return next(rid for rid in server.swaps if rid.startswith(f"{session}-"))


async def test_pause_without_abort_lets_running_turns_finish_on_their_version():
    server = StreamingFakeServer()
    manager = AsyncLLMServerManager([server])
    task = asyncio.ensure_future(manager.generate(req("t", [1], {"max_tokens": 10})))
    await asyncio.sleep(0.03)
    assert await manager.pause(abort=False) == 0
    assert task.done()  # pause returned only once nothing ran
    manager.resume(1)
    out = await task
    assert out.versions == [0] * 10 and out.finish_reason == "length"
    assert manager.resumed_turns == 0


async def test_a_server_dead_while_pausing_does_not_stop_the_pause():
    a = FakeServer("a")
    manager = AsyncLLMServerManager([a])

    async def dead_abort(request_id):
        raise EngineDeadError("a died")

    a.abort = dead_abort  # type: ignore[method-assign]
    task = asyncio.ensure_future(manager.generate(req("t", [1], {"delay": 0.05})))
    await asyncio.sleep(0.01)
    assert await manager.pause(abort=True) == 1
    manager.resume(1)
    assert (await task).token_ids == [1, 2, 3]


async def test_a_restarted_server_stamps_the_version_it_was_given_until_the_next_push():
    """A push every 2 steps: servers at version 2, the trainer at 3 restarts server 1 with its
    version-3 weights; its tokens carry 3, the other's 2, and after the push at 4 both 4."""
    manager = AsyncLLMServerManager([FakeServer("a"), FakeServer("b")])
    manager.resume(2)
    manager.replace_server(1, FakeServer("b2"), version=3)
    first = await manager.generate(req("x", [1], {}))
    second = await manager.generate(req("y", [1], {}))
    picked = {manager.server_for("x"): first.versions, manager.server_for("y"): second.versions}
    assert picked == {0: [2, 2, 2], 1: [3, 3, 3]}
    manager.resume(4)
    out = await manager.generate(req("y", [1], {}))
    assert out.versions == [4, 4, 4]
