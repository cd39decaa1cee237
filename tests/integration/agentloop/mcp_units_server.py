"""An MCP stdio server for the error-reporting tests (mcp 2.x ``MCPServer``): ``convert``
raises a plain ``ValueError`` for an unknown unit (the SDK sends the client only ``Error
executing tool convert``) and the SDK's own ``ToolError`` for a negative value (its message is
sent). ``python mcp_units_server.py plain`` logs without rich, as a server without it would."""

from __future__ import annotations

import logging
import sys

if sys.argv[1:] == ["plain"]:  # before MCPServer: its own logging setup then does nothing
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

METRES = {"m": 1.0, "km": 1000.0, "mile": 1609.344}

server = MCPServer("units")


@server.tool()
def convert(value: float, unit: str) -> str:
    """Convert a length in the given unit to metres."""
    if value < 0:
        raise ToolError("value must be >= 0")
    if unit not in METRES:
        raise ValueError(f"unknown unit {unit!r}")
    return f"{value * METRES[unit]:g} m"


if __name__ == "__main__":
    server.run("stdio")
