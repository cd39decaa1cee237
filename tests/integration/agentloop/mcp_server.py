"""An MCP server for the tests (mcp 2.x ``MCPServer``, formerly FastMCP): over stdio with
``python mcp_server.py``, over HTTP with ``python mcp_server.py sse|streamable-http PORT``.
Tools: add, slow_echo, crash (kills the server), hang (blocks the whole server), pid."""

from __future__ import annotations

import asyncio
import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
async def slow_echo(text: str, seconds: float = 0.5) -> str:
    """Echo the text after a delay."""
    await asyncio.sleep(seconds)
    return f"echo: {text}"


@server.tool()
def crash() -> str:
    """Kill this server process."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Block the server's event loop (a wedged server: it answers nothing, not even pings)."""
    time.sleep(3600)  # noqa: ASYNC251 - blocking on purpose
    return "never"


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2:  # python mcp_server.py sse|streamable-http PORT
        server.run(sys.argv[1], host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
