"""An MCP server (stdio) whose one tool says where it runs: the pid of the Ray raylet among
its ancestors (the raylet started the worker that started this server), so a test can tell
the node."""

from __future__ import annotations

import psutil
from mcp.server.mcpserver import MCPServer

server = MCPServer("where")


@server.tool()
def node(text: str = "") -> str:
    """The raylet pid of the node this server runs on."""
    for parent in psutil.Process().parents():
        if "raylet" in parent.name():
            return f"raylet {parent.pid}"
    return "raylet none"


if __name__ == "__main__":
    server.run("stdio")
