"""The gateway's HTTP server: OpenAI- and Anthropic-compatible routes per session on the
agent-loop worker's own event loop (aiohttp, started on first use), so a call goes from the
agent's HTTP request to the server manager's ``generate`` without leaving the process.

Routes (``{base} = /sessions/{sid}/v1``):
- ``POST {base}/chat/completions`` (``stream`` as server-sent events), ``POST {base}/responses``,
  ``GET {base}/models``;
- ``POST {base}/messages`` and ``POST {base}/messages/count_tokens`` (Anthropic Messages; an
  Anthropic SDK given ``/sessions/{sid}`` as its base URL appends ``/v1/messages``; one given
  ``{base}`` itself reaches the same routes under ``{base}/v1/``);
- ``POST /sessions``: an agent running elsewhere takes the next waiting rollout (its row,
  session id and base URL; 204 when none waits); ``POST /sessions/{sid}/reward``
  (``{"reward": x}``, or ``{"reward": x, "call_id": id}`` for one call's step reward);
  ``POST /sessions/{sid}/state`` (``{"state_key": "..."}``: the state the next chat call acts
  on, GiGPO's anchor key of its turn); ``POST /sessions/{sid}/end``.
Errors use each dialect's error shape (OpenAI's; Anthropic's on the Messages routes): 404
unknown session, 409 a call after the session ended, 400 a malformed body or a call over a
session limit (naming the field or config key), 401 a wrong key (``Authorization: Bearer`` or
Anthropic's ``x-api-key``), 500 a fault behind the gateway (the engine's error, also logged).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from agentloop.gateway import anthropic_api
from agentloop.gateway.messages import GatewayInputError
from agentloop.gateway.openai_api import (
    chat_call,
    chat_chunks,
    chat_response,
    error_body,
    sse,
)
from agentloop.gateway.responses_api import responses_call, responses_events, responses_response
from agentloop.gateway.session import ChatCall, Completion, Session

if TYPE_CHECKING:
    from agentloop.config import GatewayConfig

__all__ = ["Gateway", "SessionEnded", "UnknownSession"]

logger = logging.getLogger(__name__)


class UnknownSession(Exception):
    """A route names a session this gateway does not hold (404)."""


class SessionEnded(Exception):
    """A call on a session that has ended (409)."""


def _json(data: Any, status: int = 200) -> web.Response:
    """A JSON response (orjson: the bodies are small, and every call pays for them)."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def _body(request: web.Request) -> Any:
    """The request's JSON body (``orjson.JSONDecodeError`` is a ``json.JSONDecodeError``)."""
    return orjson.loads(await request.read())


def _error(
    status: int,
    message: str,
    param: str | None = None,
    kind: str | None = None,
    code: str | None = None,
) -> web.Response:
    kind = kind or ("invalid_request_error" if status in (400, 409) else "not_found_error")
    return _json(error_body(message, param, kind, code), status=status)


def _anthropic_error(
    status: int,
    message: str,
    param: str | None = None,
    kind: str | None = None,
    code: str | None = None,
) -> web.Response:
    """The Anthropic error shape (its ``type`` from the status; no ``param`` or ``code``: the
    message names the field, and a context-length error's message holds the counts)."""
    body = anthropic_api.error_body(message, anthropic_api.ERROR_TYPES[status])
    return _json(body, status=status)


Fail = Callable[..., web.Response]
_ANTHROPIC_HEADERS = ("anthropic-version", "anthropic-beta")


class Gateway:
    """One per agent-loop worker: its sessions and the server they are reached through."""

    def __init__(self, config: GatewayConfig, model: str = "agentloop") -> None:
        self.config = config
        self.model = model
        self.sessions: dict[str, Session] = {}
        self.waiting: asyncio.Queue[tuple[Session, dict[str, Any]]] = asyncio.Queue()
        self.claimed: dict[str, asyncio.Future[None]] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---- life ----------------------------------------------------------------------------
    async def start(self) -> str:
        """Listen on ``host:port`` (a free port for 0); returns the root URL."""
        if self._runner is not None:
            return self.url
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[self._auth])
        v1 = "/sessions/{sid}/v1"
        app.router.add_post(f"{v1}/chat/completions", self._chat)
        app.router.add_post(f"{v1}/responses", self._responses)
        app.router.add_get(f"{v1}/models", self._models)
        for base in (v1, f"{v1}/v1"):  # base URL /sessions/{sid} (the SDKs' way) or {v1}
            app.router.add_post(f"{base}/messages", self._messages)
            app.router.add_post(f"{base}/messages/count_tokens", self._count_tokens)
        app.router.add_post("/sessions", self._claim)
        app.router.add_post("/sessions/{sid}/reward", self._reward)
        app.router.add_post("/sessions/{sid}/state", self._state)
        app.router.add_post("/sessions/{sid}/end", self._end)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, self.config.port))
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        host = self.config.host
        if host in ("0.0.0.0", ""):  # reachable from other machines: this host's address
            host = socket.gethostbyname(socket.gethostname())
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        logger.info("session gateway listening on %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def base_url(self, session: Session) -> str:
        return f"{self.url}/sessions/{session.id}/v1"

    @property
    def api_key(self) -> str:
        return self.config.api_key or "agentloop"

    # ---- sessions ------------------------------------------------------------------------
    def open(self, session: Session) -> None:
        self.sessions[session.id] = session

    def close(self, session: Session) -> None:
        session.ended = True
        self.sessions.pop(session.id, None)
        self.claimed.pop(session.id, None)

    async def offer(self, session: Session, row: dict[str, Any]) -> asyncio.Future[None]:
        """Queue a rollout for an agent running elsewhere; the future ends with the session
        (``POST /sessions/{sid}/end``)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.claimed[session.id] = done
        await self.waiting.put((session, row))
        return done

    # ---- handlers ------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every route wants the key when ``gateway.api_key`` is set, as a bearer token or
        Anthropic's ``x-api-key`` (401 otherwise)."""
        key = self.config.api_key
        if (
            key is not None
            and request.headers.get("Authorization", "") != f"Bearer {key}"
            and request.headers.get("x-api-key") != key
        ):
            fail = _anthropic_error if "/messages" in request.path else _error
            return fail(401, "wrong API key (rollout.gateway.api_key)", None, "auth_error")
        return await handler(request)

    def _session(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        session = self.sessions.get(sid)
        if session is None:
            raise UnknownSession(sid)
        if session.ended:
            raise SessionEnded(sid)
        return session

    async def _call(
        self, request: web.Request, parse: Callable[[Any], ChatCall]
    ) -> tuple[Session, ChatCall, Any]:
        """The session, the parsed call (hosted-service fields new to the session logged
        once) and the body; raises what ``_failure`` answers."""
        session = self._session(request)
        try:
            body = await _body(request)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise GatewayInputError("the request body is not valid JSON", None) from None
        call = parse(body)
        new = sorted(k for k in call.recorded if k not in session.recorded)
        if new:
            logger.info("session %s: accepted, not acted on: %s", session.id, ", ".join(new))
        return session, call, body

    @staticmethod
    def _failure(request: web.Request, exc: Exception, fail: Fail) -> web.Response:
        if isinstance(exc, UnknownSession):
            return fail(404, f"no session {exc.args[0]!r} on this gateway", "sid")
        if isinstance(exc, SessionEnded):
            return fail(409, f"session {exc.args[0]!r} has ended; start a new one", "sid")
        if isinstance(exc, GatewayInputError):
            return fail(400, str(exc), exc.param, code=exc.code)
        # a fault behind the gateway (the engine): the agent's 500
        logger.error("gateway call on session %s failed", request.match_info["sid"], exc_info=exc)
        return fail(500, f"{type(exc).__name__}: {exc}", None, "server_error")

    async def _serve(
        self,
        request: web.Request,
        parse: Callable[[Any], ChatCall],
        respond: Callable[[Completion, dict[str, Any]], Awaitable[web.StreamResponse]],
        fail: Fail = _error,
    ) -> web.StreamResponse:
        try:
            session, call, body = await self._call(request, parse)
            completion = await session.complete(call)
        except Exception as exc:
            return self._failure(request, exc, fail)
        return await respond(completion, body)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        async def respond(c: Completion, body: dict[str, Any]) -> web.StreamResponse:
            if not body.get("stream"):
                return _json(chat_response(c, self.model))
            options = body.get("stream_options") or {}
            chunks = chat_chunks(c, self.model, bool(options.get("include_usage")))
            return await _stream(request, sse(chunks, named=False))

        return await self._serve(request, chat_call, respond)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        async def respond(c: Completion, body: dict[str, Any]) -> web.StreamResponse:
            if not body.get("stream"):
                return _json(responses_response(c, self.model))
            return await _stream(request, sse(responses_events(c, self.model), named=True))

        return await self._serve(request, responses_call, respond)

    def _anthropic_parse(self, request: web.Request, count_only: bool = False) -> Any:
        def parse(body: Any) -> ChatCall:
            call = anthropic_api.messages_call(body, count_only=count_only).call
            for header in _ANTHROPIC_HEADERS:  # they steer the hosted API: recorded
                if header in request.headers:
                    call.recorded[header] = request.headers[header]
            return call

        return parse

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        async def respond(c: Completion, body: dict[str, Any]) -> web.StreamResponse:
            if body.get("stream") is not True:
                return _json(anthropic_api.messages_response(c, self.model))
            events = anthropic_api.messages_events(c, self.model)
            return await _stream(request, anthropic_api.sse(events))

        parse = self._anthropic_parse(request)
        return await self._serve(request, parse, respond, _anthropic_error)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        try:
            session, call, _ = await self._call(request, self._anthropic_parse(request, True))
            tokens = await session.prompt_tokens(call)
        except Exception as exc:
            return self._failure(request, exc, _anthropic_error)
        return _json({"input_tokens": tokens})

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._session(request)
        except (UnknownSession, SessionEnded) as exc:
            return _error(404, f"no open session {exc.args[0]!r} on this gateway", "sid")
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "agentloop"}
        return _json({"object": "list", "data": [model]})

    async def _claim(self, request: web.Request) -> web.Response:
        try:
            session, row = self.waiting.get_nowait()
        except asyncio.QueueEmpty:
            return web.Response(status=204)
        return _json(
            {
                "session_id": session.id,
                "base_url": self.base_url(session),
                "anthropic_base_url": f"{self.url}/sessions/{session.id}",
                "api_key": self.api_key,
                "model": self.model,
                "row": row,
            }
        )

    async def _reward(self, request: web.Request) -> web.Response:
        def check(body: dict[str, Any]) -> None:
            reward = body.get("reward")
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                raise GatewayInputError("reward must be a number", "reward")

        async def apply(session: Session, body: dict[str, Any]) -> None:
            if body.get("call_id") is not None:
                session.step_rewards[str(body["call_id"])] = float(body["reward"])
            else:
                session.reward = float(body["reward"])

        return await self._session_post(request, check, apply)

    async def _state(self, request: web.Request) -> web.Response:
        def check(body: dict[str, Any]) -> None:
            key = body.get("state_key")
            if not isinstance(key, str) or not key:
                raise GatewayInputError("state_key must be a non-empty string", "state_key")

        async def apply(session: Session, body: dict[str, Any]) -> None:
            session.state_key = body["state_key"]

        return await self._session_post(request, check, apply)

    async def _session_post(
        self,
        request: web.Request,
        check: Callable[[dict[str, Any]], None],
        apply: Callable[[Session, dict[str, Any]], Awaitable[None]],
    ) -> web.Response:
        """A POST on an open session's route: its JSON body ``check``-ed (a
        ``GatewayInputError`` names the field), then ``apply``-ed; 404 / 409 / 400 otherwise."""
        try:
            session = self._session(request)
            body = await _body(request)
            if not isinstance(body, dict):
                body = {}
            check(body)
        except UnknownSession as exc:
            return _error(404, f"no session {exc.args[0]!r} on this gateway", "sid")
        except SessionEnded as exc:
            return _error(409, f"session {exc.args[0]!r} has ended", "sid")
        except (GatewayInputError, json.JSONDecodeError) as exc:
            return _error(400, str(exc), getattr(exc, "param", None))
        await apply(session, body)
        return _json({"ok": True})

    async def _end(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        session = self.sessions.get(sid)
        if session is None:
            return _error(404, f"no session {sid!r} on this gateway", "sid")
        try:
            body = await _body(request) if request.can_read_body else {}
        except json.JSONDecodeError:
            return _error(400, "the request body is not valid JSON", None)
        reward = body.get("reward") if isinstance(body, dict) else None
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                return _error(400, "reward must be a number", "reward")
            session.reward = float(reward)
        session.ended = True
        done = self.claimed.get(sid)
        if done is not None and not done.done():
            done.set_result(None)
        return _json({"ok": True})


async def _stream(request: web.Request, chunks: Any) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    response.headers["Cache-Control"] = "no-cache"
    await response.prepare(request)
    for chunk in chunks:
        await response.write(chunk)
    await response.write_eof()
    return response
