"""An MCP server for the tests (mcp 2.x ``MCPServer``, formerly FastMCP), over stdio:
``python mcp_server.py``. Tools: add, slow_echo, crash (kills the server), pid."""

from __future__ import annotations

import asyncio
import os

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
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


if __name__ == "__main__":
    server.run("stdio")
