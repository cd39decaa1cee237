"""What went wrong with an MCP server, in one line, and where its stderr goes.

A stdio server's stderr goes to a file of its own, ``<run dir>/logs/mcp-<server>-<pid>.log``
(named in the log when it starts), not the trainer's console. It is also where two things the
mcp SDK does not pass to the client are found again:

- why a server that died while starting died: it runs under ``/bin/sh``, which appends
  ``[agentloop] MCP server exited with code N`` when it exits; its last stderr lines say the rest.
- what a tool's exception said: mcp 2.x's ``MCPServer`` answers an exception other than its own
  ``ToolError`` with ``Error executing tool <name>`` alone and logs the traceback; the message is
  the last exception before ``The above exception was the direct cause ...`` in that traceback
  (plain or rich formatted; rich wraps lines at the terminal width, so the server gets
  ``COLUMNS=200`` unless its ``env`` sets it). Crash tracebacks are matched to results in the
  order the server wrote them, per tool; the file is per process (pid), so workers never read
  each other's.

The run dir comes from ``$AGENTLOOP_RUN_DIR`` (set by the trainer for its workers); without it
the files go to ``<temp dir>/agentloop-logs``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any, Protocol, TextIO

__all__ = [
    "RUN_DIR_ENV",
    "ServerLog",
    "crash_messages",
    "log_dir",
    "root_cause",
    "start_failure",
    "tool_error_text",
]

logger = logging.getLogger(__name__)

RUN_DIR_ENV = "AGENTLOOP_RUN_DIR"
_EXIT_MARK = "[agentloop] MCP server exited with code "
# Runs the server and records its exit code in its stderr (the SDK's client does not expose it).
_SH_WRAPPER = f'code=0; "$@" || code=$?; echo "{_EXIT_MARK}$code" >&2; exit $code'
_CAUSE = "The above exception was the direct"
_CRASH = "UnexpectedToolError: "
_MAX_PENDING = 256  # crash tracebacks not yet matched to a result (their calls may have timed out)


def log_dir() -> Path:
    """``$AGENTLOOP_RUN_DIR/logs``, else ``<temp dir>/agentloop-logs``."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    return Path(run_dir) / "logs" if run_dir else Path(tempfile.gettempdir()) / "agentloop-logs"


def _exception_before(lines: list[str], i: int) -> str:
    """The exception text printed just above line ``i`` (the "direct cause" line)."""
    rich = lines[i][:1].isspace()  # rich indents its traceback under the log columns
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    parts: list[str] = []
    while j >= 0:
        text = lines[j].strip()
        frame = text[:1] in "╰│╭" or text.startswith("Traceback (most recent")
        if not text or frame or (not rich and lines[j][:1].isspace()):
            break
        parts.append(text)
        j -= 1
    return " ".join(reversed(parts))


def crash_messages(lines: list[str]) -> list[tuple[int, str | None, str]]:
    """``(index after the entry, tool name, message)`` for each tool crash an ``MCPServer``
    logged in ``lines``; the name is ``None`` where the entry's last line is cut short."""
    found: list[tuple[int, str | None, str]] = []
    cause: str | None = None
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith(_CAUSE):
            cause = _exception_before(lines, i)
        elif _CRASH in text and cause is not None:
            tail, end = text.split(_CRASH, 1)[1], i + 1
            while len(tail.split()) < 4 and end < len(lines) and lines[end].strip():
                tail, end = f"{tail} {lines[end].strip()}", end + 1  # wrapped by rich
            words = tail.split()
            named = len(words) >= 4 and words[:3] == ["Error", "executing", "tool"]
            found.append((end, words[3].rstrip(":") if named else None, cause))
            cause = None
    return found


class ServerLog:
    """The stderr file of one stdio server, across its restarts (each appends)."""

    def __init__(self, server: str, directory: Path | None = None) -> None:
        directory = directory if directory is not None else log_dir()
        self.path = directory / f"mcp-{re.sub(r'[^A-Za-z0-9_.-]', '_', server)}-{os.getpid()}.log"
        self._start = 0  # where the current incarnation's stderr begins
        self._offset = 0  # crash tracebacks before this are parsed
        self._pending: list[tuple[str | None, str]] = []

    def open(self) -> TextIO:
        """A handle for the next incarnation's stderr (the caller closes it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a", encoding="utf-8")
        self._start = self._offset = handle.tell()
        self._pending.clear()
        return handle

    @staticmethod
    def env(env: dict[str, str] | None) -> dict[str, str]:
        """The server's ``env`` with a wide terminal (fewer wrapped lines to join)."""
        return {"COLUMNS": "200", **(env or {})}

    @staticmethod
    def wrap(argv: list[str]) -> list[str]:
        """``argv`` run by ``/bin/sh``, which records the exit code (as is where there is none)."""
        if os.name != "posix" or not os.path.exists("/bin/sh"):
            return argv
        return ["/bin/sh", "-c", _SH_WRAPPER, "mcp-server", *argv]

    def _read(self, start: int) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(start)
                return f.read()
        except OSError:
            return b""

    def exit_code(self) -> int | None:
        """The current incarnation's exit code, once it has exited under the wrapper."""
        text = self._read(self._start).decode(errors="replace")
        codes = re.findall(re.escape(_EXIT_MARK) + r"(-?\d+)", text)
        return int(codes[-1]) if codes else None

    def tail(self, n: int = 3) -> str:
        """The last ``n`` stderr lines of the current incarnation (of a Python traceback, the
        exception after its last frame), joined by `` | ``."""
        text = self._read(self._start).decode(errors="replace")
        lines = [s.rstrip() for s in text.splitlines() if s.strip() and _EXIT_MARK not in s]
        if any(s.startswith("Traceback (most recent call last)") for s in lines):
            frames = [i for i, s in enumerate(lines) if s[:1].isspace()]
            lines = lines[frames[-1] + 1 :] if frames else lines
        return " | ".join(s.strip() for s in lines[-n:])

    def crash_message(self, tool: str) -> str | None:
        """The message of the oldest unmatched crash traceback of ``tool``, if there is one."""
        raw = self._read(self._offset)
        raw = raw[: raw.rfind(b"\n") + 1]  # whole lines only
        chunks = raw.split(b"\n")
        lines = [c.decode(errors="replace") for c in chunks]
        used = 0
        for end, name, message in crash_messages(lines):
            if name is None and end >= len(lines) - 1:
                break  # still being written (another call's): parse it again next time
            self._pending.append((name, message))
            used = end
        self._offset += sum(len(c) + 1 for c in chunks[:used])
        del self._pending[:-_MAX_PENDING]
        for k, (name, message) in enumerate(self._pending):
            if name == tool:
                del self._pending[k]
                return message
        return None


class _Server(Protocol):
    """What these helpers read of an ``MCPServerConnection``."""

    name: str
    spec: dict[str, Any]
    start_timeout_s: float
    log: ServerLog | None
    argv: list[str]
    warned: set[str]


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of (nested) exception groups that is not a cancellation."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        leaves = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (leaves or list(exc.exceptions))[0]
    return exc


def start_failure(exc: BaseException, server: _Server) -> str:
    """One line: why ``server`` failed to start, from the root of ``exc`` and, for a stdio
    server, its exit code, command and last stderr lines."""
    from agentloop.tools.base import ToolInfraError

    root = root_cause(exc)
    if isinstance(root, ToolInfraError):  # raised by us, already one line
        return str(root)
    if isinstance(root, TimeoutError):
        what = f"no MCP handshake within {server.start_timeout_s:g} s"
    else:
        what = f"{type(root).__name__}: {root}"
    if server.log is None:
        return f"{what} (url {server.spec['url']})"
    code = server.log.exit_code()
    if code is not None:
        what = f"exited with code {code}"
    what = f"{what} running `{shlex.join(server.argv)}`"
    tail = server.log.tail()
    if not tail:
        return f"{what}; no stderr output (log: {server.log.path})"
    return f"{what}; last stderr lines: {tail} (full log: {server.log.path})"


def tool_error_text(server: _Server, tool: str, text: str) -> str:
    """What the model reads for an ``is_error`` result of ``tool``: the server's text less the
    SDK's ``Error executing tool <name>: `` prefix; for a crash (that text alone: the mcp SDK
    keeps a plain exception's message on the server), the message from the stderr log. Call
    on the MCP loop as results arrive (crash tracebacks are matched in that order)."""
    bare = f"Error executing tool {tool}"
    if text.startswith(f"{bare}: "):
        return text[len(bare) + 2 :]
    if text != bare:
        return text or "no message"
    message = server.log.crash_message(tool) if server.log is not None else None
    if tool not in server.warned:  # once per tool: the server's author may want to know
        server.warned.add(tool)
        if message is not None and server.log is not None:
            logger.warning(
                "MCP server %s: tool %s raised %s (traceback in %s)",
                server.name,
                tool,
                message,
                server.log.path,
            )
        else:
            logger.warning(
                "MCP server %s: tool %s raised an exception it did not describe (the mcp SDK "
                "sends only %r unless the tool raises mcp.server.mcpserver.exceptions.ToolError)",
                server.name,
                tool,
                bare,
            )
    return message or bare
