"""``WorkspacePool``: per sample a fresh sandboxed copy of its task's workspace, from a warm pool.

``async with pool.sample(task) as ws:`` gives the sample its own copy (taken from the task's
prepared copies when one is ready, else made now) and makes it ``current_workspace()`` for the
loop and its tools; ``await ws.run(cmd)`` runs an agent command in the sandbox under the agent's
limit, ``await ws.check()`` the task's check under its own limit (its ``CheckResult`` is the
reward). On leaving, the copy's processes are killed and its folder removed. After each take,
copies are prepared in the background (bounded), so the copy is off the critical path.
``close()`` removes the run folder (and the shared folder above it when no other run is
left there); a crashed worker's folder goes at the next start.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

from agentloop.tools.sandbox import sandbox_uid
from agentloop.workspace.check import CheckResult, score_check
from agentloop.workspace.config import WorkspaceConfig
from agentloop.workspace.metrics import WorkspaceMetrics
from agentloop.workspace.runner import CommandResult, resolve_backend, run_command
from agentloop.workspace.source import (
    RUN_ROOT_NAME,
    chown_tree,
    copy_tree,
    make_run_root,
    remove_run_root,
    remove_tree,
    unpack,
)
from agentloop.workspace.task import WorkspaceTask

__all__ = ["SandboxError", "Workspace", "WorkspacePool", "current_workspace"]

logger = logging.getLogger(__name__)

_CURRENT: contextvars.ContextVar[Workspace] = contextvars.ContextVar("agentloop_workspace")


class SandboxError(RuntimeError):
    """A workspace could not be prepared (copy or setup failed) or a command not started."""


def current_workspace() -> Workspace:
    """The workspace of the sample running in this context (inside ``pool.sample(task)``)."""
    try:
        return _CURRENT.get()
    except LookupError:
        raise LookupError(
            "no workspace in this context: run the sample inside WorkspacePool.sample(task)"
        ) from None


class Workspace:
    """One sample's copy of a task's workspace, with the sandbox its commands run in."""

    def __init__(self, pool: WorkspacePool, task: WorkspaceTask, path: Path, uid: int | None):
        self.pool = pool
        self.task = task
        self.path = path
        """The folder: writable by the sandbox, the only such folder."""
        self.uid = uid
        """The uid its commands run as (a fresh one when the worker is root; else None)."""
        self.prepare_s = 0.0
        self.warm = False
        """Taken ready from the warm pool."""
        self.sandbox_errors = 0
        """Commands of this copy the sandbox could not start."""
        self._running: set[asyncio.Task[CommandResult]] = set()

    async def run(
        self, argv: list[str] | tuple[str, ...], *, timeout_s: float | None = None
    ) -> CommandResult:
        """Run an agent command in the sandbox (default limit ``agent_timeout_s``)."""
        config = self.pool.config
        return await self._run(argv, timeout_s or config.agent_timeout_s)

    async def check(self) -> CheckResult:
        """Run the task's check under ``check_timeout_s``; its score is the reward."""
        metrics = self.pool.metrics
        try:
            result = await self._run(self.task.check, self.task.check_timeout_s)
        except SandboxError as e:
            return CheckResult(0.0, 0, 0, False, f"sandbox error: {e}", 0.0, None, "")
        outcome = score_check(self.task, result, self.pool.config.output_tail_chars)
        metrics.check_s.append(result.seconds)
        metrics.check_timeouts += result.timed_out
        return outcome

    async def _run(self, argv: tuple[str, ...] | list[str], timeout_s: float) -> CommandResult:
        pool = self.pool
        config = pool.config
        coro = run_command(
            argv,
            workdir=str(self.path),
            uid=self.uid,
            backend=pool.backend,
            limits=config.limits,
            timeout_s=timeout_s,
            max_output_bytes=config.max_output_bytes,
            python_env=config.python_env,
        )
        task = asyncio.ensure_future(coro)
        self._running.add(task)
        try:
            return await task
        except OSError as e:
            pool.metrics.sandbox_errors += 1
            self.sandbox_errors += 1
            raise SandboxError(f"the command {argv[0]!r} could not start: {e}") from e
        finally:
            self._running.discard(task)

    async def close(self) -> None:
        """Kill its commands (their sandboxes go with them) and remove the folder."""
        for task in list(self._running):
            task.cancel()
        for task in list(self._running):
            with suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.to_thread(remove_tree, self.path)


class WorkspacePool:
    """Fresh sandboxed workspace copies for samples, prepared ahead per task."""

    def __init__(self, config: WorkspaceConfig | None = None) -> None:
        self.config = config or WorkspaceConfig()
        self.backend = resolve_backend(self.config.sandbox)
        root = Path(self.config.root or os.path.join(tempfile.gettempdir(), RUN_ROOT_NAME))
        self.run_root = make_run_root(root)
        """``<root>/<pid>-<token>``: every folder of this pool, removed by ``close``."""
        self.metrics = WorkspaceMetrics()
        self._sources: dict[Path, asyncio.Task[Path]] = {}
        self._warm: dict[str, list[Workspace]] = {}
        self._fillers: dict[str, asyncio.Task[None]] = {}
        self._prepares = asyncio.Semaphore(self.config.max_concurrent_prepares)
        self._count = 0
        self._closed = False

    @asynccontextmanager
    async def sample(self, task: WorkspaceTask) -> AsyncIterator[Workspace]:
        """A fresh copy for one sample, ``current_workspace()`` inside; removed on exit."""
        ws = await self.acquire(task)
        token = _CURRENT.set(ws)
        try:
            yield ws
        finally:
            _CURRENT.reset(token)
            await ws.close()

    async def acquire(self, task: WorkspaceTask) -> Workspace:
        """A ready copy of ``task``'s workspace (the caller closes it)."""
        start = time.perf_counter()
        ready = self._warm.get(task.key)
        if ready:
            ws = ready.pop()
            ws.warm = True
            self.metrics.warm_hits += 1
        else:
            ws = await self._prepare(task)
        self.metrics.acquire_s.append(time.perf_counter() - start)
        self._refill(task)
        return ws

    async def warm_up(self, tasks: list[WorkspaceTask]) -> None:
        """Prepare each task's warm copies now (e.g. before the first step)."""
        for task in tasks:
            self._refill(task)
        await asyncio.gather(*self._fillers.values(), return_exceptions=True)

    def _refill(self, task: WorkspaceTask) -> None:
        if self._closed or self.config.warm_per_task == 0:
            return
        filler = self._fillers.get(task.key)
        if filler is None or filler.done():
            self._fillers[task.key] = asyncio.create_task(self._fill(task))

    async def _fill(self, task: WorkspaceTask) -> None:
        ready = self._warm.setdefault(task.key, [])
        while len(ready) < self.config.warm_per_task and self._warm_total() < self.config.max_warm:
            try:
                ws = await self._prepare(task)
            except SandboxError as e:
                logger.warning("workspace pool: a warm copy failed: %s", e)
                return
            ready.append(ws)

    def _warm_total(self) -> int:
        return sum(len(ready) for ready in self._warm.values())

    async def _source(self, task: WorkspaceTask) -> Path:
        """The folder copies are made from (an archive is unpacked once per run)."""
        if task.workspace.is_dir():
            return task.workspace
        if task.workspace not in self._sources:
            dest = self.run_root / f"source-{len(self._sources)}"
            self._sources[task.workspace] = asyncio.ensure_future(unpack(task.workspace, dest))
        return await asyncio.shield(self._sources[task.workspace])

    async def _prepare(self, task: WorkspaceTask) -> Workspace:
        async with self._prepares:
            start = time.perf_counter()
            self._count += 1
            path = self.run_root / f"ws-{self._count}-{secrets.token_hex(3)}"
            try:
                source = await self._source(task)
                await copy_tree(source, path)
                uid = sandbox_uid(str(path)) if self.backend == "bwrap" else None
                if uid is not None:
                    await chown_tree(path, uid)
            except (OSError, ValueError) as e:
                self.metrics.sandbox_errors += 1
                if path.exists():
                    await asyncio.to_thread(remove_tree, path)
                raise SandboxError(f"copying {task.workspace} failed: {e}") from e
            ws = Workspace(self, task, path, uid)
            if task.setup is not None:
                await self._setup(ws)
            ws.prepare_s = time.perf_counter() - start
            self.metrics.prepare_s.append(ws.prepare_s)
            return ws

    async def _setup(self, ws: Workspace) -> None:
        result = await ws._run(ws.task.setup or (), ws.task.check_timeout_s)
        if result.exit_code != 0 or result.reason is not None:
            self.metrics.sandbox_errors += 1
            await ws.close()
            why = result.reason or f"exited {result.exit_code}"
            raise SandboxError(f"setup of {ws.task.workspace} {why}: {result.tail(500)}")

    async def close(self) -> None:
        """Stop the fillers and remove every copy and the run folder."""
        self._closed = True
        for filler in self._fillers.values():
            filler.cancel()
        await asyncio.gather(*self._fillers.values(), return_exceptions=True)
        await asyncio.gather(*self._sources.values(), return_exceptions=True)
        self._warm.clear()
        await asyncio.to_thread(remove_run_root, self.run_root)
