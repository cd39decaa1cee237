"""OpenEnv environment servers a worker reaches: given by URL, or started by a command.

``OpenEnvServers`` holds one worker's servers. A ``url:`` server is only health-checked. A
``command:`` is started ``servers`` times, each on a free port (``{port}`` in the command), with
its output in a log file, health-checked (``GET /health``) before any sample uses it, and
stopped (its process group) when the worker closes; a server that stops answering is
restarted by the next sample that finds it dead, and the samples it was serving fail alone.
A server that never answers its health check is an error naming its URL and the last lines of
its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

__all__ = ["OpenEnvServerError", "OpenEnvServers", "ServerProcess", "free_port", "log_tail"]

logger = logging.getLogger(__name__)

HEALTH_PATH = "/health"


class OpenEnvServerError(RuntimeError):
    """An environment server did not start, or stopped answering."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(text) or "(empty log)"


async def wait_healthy(url: str, timeout_s: float, proc: asyncio.subprocess.Process | None) -> None:
    """Poll ``url``'s health route until it answers 200; raises OpenEnvServerError (with
    the reason) when it does not within ``timeout_s`` or its process exits."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
        while True:
            if proc is not None and proc.returncode is not None:
                raise OpenEnvServerError(f"its process exited with {proc.returncode}")
            try:
                async with http.get(url + HEALTH_PATH) as reply:
                    if reply.status == 200:
                        return
                    last = f"HTTP {reply.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise OpenEnvServerError(f"no healthy answer at {url}{HEALTH_PATH} ({last})")
            await asyncio.sleep(0.2)


@dataclass(slots=True)
class ServerProcess:
    """One environment server: its URL, and its process and log when we started it."""

    url: str
    proc: asyncio.subprocess.Process | None = None
    log: Path | None = None
    in_flight: int = 0
    restarts: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The server gets SIGTERM when the worker that started it dies (Linux)."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class OpenEnvServers:
    """A worker's environment servers (``url`` or ``command`` x ``servers``)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        command: str | None = None,
        servers: int = 1,
        health_timeout_s: float = 60.0,
        log_dir: str | None = None,
    ) -> None:
        if (url is None) == (command is None):
            raise ValueError("openenv takes exactly one of url: ... or command: '...'")
        self.command = command
        self.health_timeout_s = health_timeout_s
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="openenv-"))
        self.servers = (
            [ServerProcess(url.rstrip("/"))]
            if url is not None
            else [ServerProcess("") for _ in range(servers)]
        )
        self._started = False
        self._start_lock = asyncio.Lock()
        self.action_tool: dict | None = None
        """The environment's action schema as a tool (read by the first sample that needs it)."""

    async def start(self) -> None:
        """Start (or check) every server; raises OpenEnvServerError naming the one that did
        not answer, with the last lines of its log."""
        async with self._start_lock:
            if self._started:
                return
            await asyncio.gather(*(self._launch(i) for i in range(len(self.servers))))
            self._started = True

    async def _launch(self, index: int) -> None:
        server = self.servers[index]
        if self.command is not None:
            port = free_port()
            server.url = f"http://127.0.0.1:{port}"
            server.log = self.log_dir / f"server{index}.log"
            argv = shlex.split(self.command.replace("{port}", str(port)))
            with server.log.open("ab") as log:
                server.proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=log, stderr=log, preexec_fn=_die_with_parent
                )
        try:
            await wait_healthy(server.url, self.health_timeout_s, server.proc)
        except OpenEnvServerError as exc:
            await server.stop()
            raise OpenEnvServerError(
                f"the OpenEnv server at {server.url} did not answer its health check: {exc}; "
                f"the last lines of its log ({server.log}):\n{log_tail(server.log)}"
            ) from None

    def acquire(self) -> ServerProcess:
        """The server with the fewest samples in flight (one more counted on it)."""
        server = min(self.servers, key=lambda s: s.in_flight)
        server.in_flight += 1
        return server

    def release(self, server: ServerProcess) -> None:
        server.in_flight -= 1

    async def recover(self, server: ServerProcess) -> bool:
        """After a sample lost its connection: restart the server if it is dead (a command
        server); True when it was restarted. A URL server is only checked again."""
        async with server.lock:
            if server.proc is not None and server.proc.returncode is None:
                try:
                    await wait_healthy(server.url, 2.0, server.proc)
                    return False
                except OpenEnvServerError:
                    await server.stop()
            if self.command is None:
                return False
            index = self.servers.index(server)
            logger.warning("OpenEnv server %s died: restarting it", server.url)
            await self._launch(index)
            server.restarts += 1
            return True

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers))
