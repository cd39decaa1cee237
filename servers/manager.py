"""``AsyncLLMServerManager``: the client-side load balancer agent loops generate through.

- A trajectory's first turn goes to the healthy server with the fewest requests *in flight*
  (decremented when a request finishes, so long requests do not skew a cumulative count).
- Later turns of the same ``session_id`` (one trajectory) stick to that server (LRU of 10k
  ids) so its prefix cache holds the conversation so far.
- Every call gets a fresh engine ``request_id`` (one session makes many engine requests).
- A server that dies (Ray actor error or ``EngineDeadError``) is marked unhealthy and the
  request is retried on another; bad input (``ValueError``) is the caller's and is raised.
- With every server dead, a request waits up to ``restart_wait_s`` for one to be replaced
  (``replace_server``, called when the driver has restarted it) and then runs there.
- Weight updates while rollout runs (async training): ``pause`` holds new turns at a gate and
  either lets the running ones finish, aborts them (``abort=True``) or keeps them running in
  the engines through the update (``keep=True``, in-flight updates); ``resume(version)``
  opens the gate under the new policy version. An aborted turn continues from the tokens it
  already sampled (kept with their log-probs, its context prefilled again); a kept turn goes
  on in its engine, which says how many tokens it had sampled at each update
  (``TokenOutput.weight_swaps``). Either way every token of a turn carries the version that
  sampled it (``TokenOutput.versions``).

Servers are Ray actor handles (``generate.remote``) or in-process objects with ``async
generate(GenerateRequest)``; the manager is itself the agent loops' ``GenerateClient``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Any

from servers.types import EngineDeadError, GenerateRequest, TokenOutput

__all__ = ["AsyncLLMServerManager", "ServerStats", "NoHealthyServerError"]

logger = logging.getLogger(__name__)


class NoHealthyServerError(EngineDeadError):
    """Every server is marked dead; nothing left to retry on."""


@dataclass(slots=True)
class ServerStats:
    index: int
    healthy: bool = True
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    generated_tokens: int = 0


def _actor_handles() -> tuple[type, ...]:
    """Ray's actor handle type (its methods are called with ``.remote``); none without Ray."""
    try:
        from ray.actor import ActorHandle
    except ImportError:  # pragma: no cover - ray is a dependency
        return ()
    return (ActorHandle,)


def _dead_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [EngineDeadError]
    try:
        from ray.exceptions import RayActorError

        errors.append(RayActorError)
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return tuple(errors)


class AsyncLLMServerManager:
    def __init__(
        self, servers: list[Any], *, max_sticky: int = 10_000, restart_wait_s: float = 0.0
    ) -> None:
        """``restart_wait_s``: how long a request waits for a replaced server when none is
        healthy (0: fail at once with ``NoHealthyServerError``)."""
        if not servers:
            raise ValueError("AsyncLLMServerManager needs at least one server")
        self.servers = list(servers)
        self.max_sticky = max_sticky
        self.restart_wait_s = restart_wait_s
        self.retried_requests = 0
        """Engine requests re-sent because their server died (over the manager's life)."""
        self._replaced: asyncio.Event | None = None
        self._stats = [ServerStats(i) for i in range(len(servers))]
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._active: dict[str, tuple[int, str]] = {}
        self._dead = _dead_errors()
        self._handles = _actor_handles()
        self.version = 0
        """Policy version the servers hold (set by ``resume``); stamped on sampled tokens."""
        self._versions: dict[int, int] = {}
        """Servers holding another version than ``version`` until the next ``resume``: a
        restarted one given the trainer's newer weights between two pushes."""
        self.resumed_turns = 0
        """Turns aborted by ``pause(abort=True)`` and continued after ``resume``."""
        self.reprefilled_tokens = 0
        """Context tokens of those continued turns (prefilled again after the update)."""
        self.kept_turns = 0
        """Turns an engine kept running through a weight update (``pause(keep=True)``)."""
        self._updates: list[int] = []
        """The version of each update that landed under running turns (``pause(keep=True)``
        then ``resume``), in order: a turn's k-th weight swap is the k-th after it started."""
        self._keeping = False
        self._open: asyncio.Event | None = None  # None: never paused (the gate is open)
        self._paused = False
        self._aborted_by_pause: set[str] = set()

    # ---- routing --------------------------------------------------------------------------
    def _pick(self, session_id: str, exclude: set[int]) -> int:
        idx = self._sticky.get(session_id)
        if idx is not None and self._stats[idx].healthy and idx not in exclude:
            self._sticky.move_to_end(session_id)
            return idx
        candidates = [s for s in self._stats if s.healthy and s.index not in exclude]
        if not candidates:
            raise NoHealthyServerError(
                f"no healthy server left for request {session_id} "
                f"({sum(not s.healthy for s in self._stats)} of {len(self._stats)} dead)"
            )
        best = min(candidates, key=lambda s: (s.in_flight, s.requests))
        self._sticky[session_id] = best.index
        self._sticky.move_to_end(session_id)
        while len(self._sticky) > self.max_sticky:
            self._sticky.popitem(last=False)
        return best.index

    async def _call(self, server: Any, request: GenerateRequest) -> TokenOutput:
        if isinstance(server, self._handles):  # a Ray actor, else an in-process server
            return await server.generate.remote(request)
        return await server.generate(request)

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """Generate one turn of session ``request.session_id`` (a new one when None);
        retried on another server if the chosen one dies, continued from its sampled tokens
        if ``pause`` aborted it. Lower ``priority`` is scheduled first by engines with
        ``scheduling_policy=priority``."""
        session_id = request.session_id or uuid.uuid4().hex
        budget = request.sampling_params.max_tokens
        tokens: list[int] = []
        log_probs: list[float] | None = []
        versions: list[int] = []
        while True:
            params = request.sampling_params
            if budget is not None:
                params = replace(params, max_tokens=budget - len(tokens))
            turn = replace(
                request,
                prompt_ids=request.prompt_ids + tokens,
                sampling_params=params,
                session_id=session_id,
            )
            out, version, paused, first = await self._generate_once(turn)
            tokens.extend(out.token_ids)
            versions.extend(await self._stamps(out, version, first))
            if log_probs is not None and out.log_probs is not None:
                log_probs.extend(out.log_probs)
            else:
                log_probs = None
            if paused:  # aborted for a weight update: continue from the tokens so far
                self.resumed_turns += 1
                self.reprefilled_tokens += len(request.prompt_ids) + len(tokens)
                if budget is None or len(tokens) < budget:
                    continue
                return TokenOutput(tokens, log_probs, "length", versions)
            return TokenOutput(tokens, log_probs, out.finish_reason, versions)

    async def _stamps(self, out: TokenOutput, version: int, first: int) -> list[int]:
        """The version of each token of ``out``: ``version`` up to its first weight swap,
        then the version of each update in turn (``first``: updates before it started)."""
        swaps = out.weight_swaps or []
        if not swaps:
            return [version] * len(out.token_ids)
        self.kept_turns += 1
        while len(self._updates) < first + len(swaps) and self._paused:
            await self._wait_open()  # it ended during the update, before its resume
        updates = [*self._updates[first:], *[self.version] * len(swaps)]  # (none missing)
        stamps = [version] * swaps[0]
        bounds = [*swaps, len(out.token_ids)]
        for k in range(len(swaps)):
            stamps.extend([updates[k]] * (bounds[k + 1] - bounds[k]))
        return stamps

    async def _generate_once(self, request: GenerateRequest) -> tuple[TokenOutput, int, bool, int]:
        """One engine request (retried elsewhere if its server dies), sent only while the
        gate is open; with the policy version it sampled under, whether ``pause`` aborted
        it and how many in-flight updates there were before it started."""
        session_id = request.session_id
        assert session_id is not None  # generate() names every session
        tried: set[int] = set()
        while True:
            while self._paused:  # a weight update is under way
                await self._wait_open()
            try:
                idx = self._pick(session_id, tried)
            except NoHealthyServerError:
                if not await self._wait_for_replacement(session_id):
                    raise
                tried.clear()
                continue
            stats = self._stats[idx]
            version = self._versions.get(idx, self.version)
            first = len(self._updates)
            engine_rid = f"{session_id}-{uuid.uuid4().hex[:12]}"
            self._active[session_id] = (idx, engine_rid)
            stats.in_flight += 1
            stats.requests += 1
            server = self.servers[idx]
            try:
                out = await self._call(server, replace(request, request_id=engine_rid))
            except self._dead as exc:
                stats.failures += 1
                # A failure of an actor a replacement already took over says nothing of it.
                if self.servers[idx] is server:
                    stats.healthy = False
                    tried.add(idx)
                self.retried_requests += 1
                logger.warning(
                    "server %d died (%s); retrying session %s's turn elsewhere",
                    idx,
                    type(exc).__name__,
                    session_id,
                )
                continue
            finally:
                stats.in_flight -= 1
                self._active.pop(session_id, None)
                aborted = engine_rid in self._aborted_by_pause
                self._aborted_by_pause.discard(engine_rid)
            stats.generated_tokens += len(out.token_ids)
            return out, version, aborted and out.finish_reason == "abort", first

    async def abort(self, session_id: str) -> bool:
        """Abort the engine request currently running for ``session_id`` (False if none)."""
        active = self._active.get(session_id)
        if active is None:
            return False
        await self._abort_engine(*active)
        return True

    # ---- weight updates during rollout ------------------------------------------------------
    async def pause(self, *, abort: bool = False, keep: bool = False) -> int:
        """Hold new turns at the gate; abort the running ones (``abort``), keep them running
        in their engines through the update (``keep``: returns at once) or let them finish.
        Returns how many were aborted (or kept)."""
        self._paused = True
        if self._open is None or self._open.is_set():
            self._open = asyncio.Event()
        if keep:
            self._keeping = True
            return len(self._active)
        aborted = 0
        if abort:
            for idx, engine_rid in list(self._active.values()):
                self._aborted_by_pause.add(engine_rid)
                try:
                    await self._abort_engine(idx, engine_rid)
                except self._dead as exc:  # its turn is retried elsewhere after the pause
                    logger.warning("server %d died while pausing (%s)", idx, type(exc).__name__)
                aborted += 1
        while any(s.in_flight for s in self._stats):
            await asyncio.sleep(0.005)
        return aborted

    def resume(self, version: int) -> None:
        """Open the gate: turns (new, and aborted ones continuing) sample under ``version``."""
        self.version = version
        self._versions.clear()  # every server got this version's weights
        if self._keeping:  # the update landed under the kept turns
            self._updates.append(version)
            self._keeping = False
        self._paused = False
        if self._open is not None:
            self._open.set()

    async def _wait_open(self) -> None:
        assert self._open is not None
        await self._open.wait()

    async def _abort_engine(self, idx: int, engine_rid: str) -> None:
        server = self.servers[idx]
        if isinstance(server, self._handles):
            await server.abort.remote(engine_rid)
        else:
            await server.abort(engine_rid)

    async def _wait_for_replacement(self, session_id: str) -> bool:
        """Wait until ``replace_server`` runs (True) or ``restart_wait_s`` passes (False)."""
        if self.restart_wait_s <= 0:
            return False
        deadline = time.monotonic() + self.restart_wait_s
        logger.warning("no healthy server for session %s; waiting for a restart", session_id)
        while not any(s.healthy for s in self._stats):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._replaced is None:
                self._replaced = asyncio.Event()
            try:
                await asyncio.wait_for(self._replaced.wait(), left)
            except TimeoutError:
                return False
        return True

    # ---- health and metrics -----------------------------------------------------------------
    def replace_server(self, index: int, server: Any, version: int | None = None) -> None:
        """Use ``server`` (a restarted one) at ``index`` and put it back into rotation;
        requests waiting for a healthy server go on. ``version``: the policy version its
        weights are (stamped on its tokens until the next ``resume``), when not the others'."""
        self.servers[index] = server
        if version is not None and version != self.version:
            self._versions[index] = version
        else:
            self._versions.pop(index, None)
        self.mark_healthy(index)

    def mark_healthy(self, index: int) -> None:
        """Put a restarted server back into rotation."""
        self._stats[index].healthy = True
        if self._replaced is not None:
            self._replaced.set()
            self._replaced = None

    def server_for(self, session_id: str) -> int | None:
        """The server index session ``session_id`` sticks to (None: not routed yet)."""
        return self._sticky.get(session_id)

    def stats(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self._stats]
