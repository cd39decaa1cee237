"""A call the caller gave up on: the next call waits for the ping that decides whether the
server hangs, even when the SDK takes several loop turns to deliver the cancellation (a fake
session on the real MCP loop; tests/reliability/test_tool_faults.py runs a real hung server)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agentloop.tools.mcp import MCPServerConnection


class FakeSession:
    """``hangs``: every call and ping waits until the session is closed, then the call fails
    as the SDK's does ("Connection closed"); else calls answer with their tool's name."""

    def __init__(self, hangs: bool) -> None:
        self.hangs = hangs
        self.closed = asyncio.Event()
        self.calls: list[str] = []

    async def call_tool(self, tool: str, arguments: dict) -> SimpleNamespace:
        self.calls.append(tool)
        if self.hangs:
            try:
                await self.closed.wait()
            except asyncio.CancelledError:
                for _ in range(20):  # the SDK's task groups take turns to unwind
                    await asyncio.sleep(0)
                raise
            raise RuntimeError("Connection closed")
        return SimpleNamespace(is_error=False, content=[], tool=tool)

    async def send_ping(self) -> None:
        if self.hangs:
            await self.closed.wait()


def _connection(sessions: list[FakeSession]) -> MCPServerConnection:
    conn = MCPServerConnection("calc", {"url": "http://unused", "ping_timeout_s": 0.2})

    async def start() -> None:  # in place of the transport: the next session, served until stop
        session = sessions.pop(0)
        conn._session, conn._stop = session, asyncio.Event()

        async def serve() -> None:
            await conn._stop.wait()
            session.closed.set()
            conn._session = None

        conn._task = asyncio.ensure_future(serve())

    conn._start = start  # type: ignore[method-assign]
    return conn


async def test_the_call_after_an_abandoned_one_waits_for_the_ping_and_gets_a_new_server():
    hung, fresh = FakeSession(hangs=True), FakeSession(hangs=False)
    conn = _connection([hung, fresh])
    conn.start()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(conn.call("hang", {}), 0.3)
    result, error = await asyncio.wait_for(conn.call("pid", {}), 5)
    assert (result.tool, error) == ("pid", None)
    assert hung.calls == ["hang"] and fresh.calls == ["pid"]  # never sent to the hung server
    assert conn.restarts == 1
    conn.close()


async def test_a_server_that_answers_the_ping_is_kept():
    slow = FakeSession(hangs=False)
    conn = _connection([slow])

    async def slow_call(tool: str, arguments: dict) -> SimpleNamespace:
        slow.calls.append(tool)
        if tool == "slow":
            await asyncio.sleep(5)
        return SimpleNamespace(is_error=False, content=[], tool=tool)

    slow.call_tool = slow_call  # type: ignore[method-assign]
    conn.start()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(conn.call("slow", {}), 0.3)
    result, _ = await asyncio.wait_for(conn.call("pid", {}), 5)
    assert result.tool == "pid" and slow.calls == ["slow", "pid"]
    assert conn.restarts == 0
    conn.close()
