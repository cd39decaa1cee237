"""HTTP front of one server: FastAPI routes served by uvicorn on the server's own event loop.

Routes: ``POST /generate`` (token ids in; ids, log-probs, finish reason out), the OpenAI ones
(``POST /v1/chat/completions``: ``tools`` in, ``tool_calls`` out; ``POST /v1/completions``: text
completion; ``GET /v1/models``: the served model), ``GET /health``, ``GET /metrics``
(Prometheus text). Bad input answers 400 with an OpenAI-style error body. The two completion
routes run through the engine's OpenAI serving layer (vLLM's); an engine without one (SGLang
here) answers them with 501.

In front of every route sits ``_Guard``: with ``ServerConfig.api_key`` set, every route but
``GET /health`` needs ``Authorization: Bearer <key>`` (else 401). A call of ``/generate`` or a
completion route is then checked against the per-request work limits
(``servers/limits.py``: ``n``, ``max_tokens``, prompt length; 400 naming the limit) and
admitted only while the sequences in flight, its own included, stay within
``max_concurrent_requests`` (else 503 with ``Retry-After: 1`` at once; there is no waiting
queue). The guard reads the body to know the request's work, parses it once and hands the
parsed body on to the route.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servers.core import ServerCore
from servers.limits import CHAT_PATH, COMPLETIONS_PATH, GENERATE_PATH, request_sequences
from servers.types import GenerateInputError, GenerateRequest, SamplingParams, error_body

__all__ = ["build_app", "HttpFront"]

logger = logging.getLogger(__name__)

OpenAIHandler = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]
"""``await handler(body) -> (status, JSON body | async iterator of SSE strings)``."""

# Routes that run the engine: the ones the work limits and the in-flight limit apply to.
_LIMITED_PATHS = frozenset({GENERATE_PATH, CHAT_PATH, COMPLETIONS_PATH})
# Scope key under which the guard hands the body it parsed on to the route.
_PARSED = "agentloop.json_body"


def _bad(message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, param=param), status_code=400)


async def _json_object(request: Request) -> dict[str, Any] | JSONResponse:
    if _PARSED in request.scope:  # the guard parsed it already
        body = request.scope[_PARSED]
    else:
        try:
            body = await request.json()
        except ValueError:
            return _bad("request body must be JSON")
        except RecursionError:  # json's C decoder gives up at ~1000 levels of [ or {
            return _bad("request body is nested too deeply to parse as JSON")
    if not isinstance(body, dict):
        return _bad("request body must be a JSON object")
    lone = _lone_surrogate(body)
    if lone is not None:
        return _bad(
            f"request body holds a lone UTF-16 surrogate ({lone!r} in a string): send valid "
            "Unicode (escape pairs like \\ud83d\\ude00 are fine)"
        )
    return body


def _lone_surrogate(value: Any) -> str | None:
    """The first string (key or value) that is not valid Unicode: JSON lets ``\\ud800`` through
    but the tokenizer, the engine's IPC and our JSON responses all fail on it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return item[exc.start : exc.end]
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when the client left before sending it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the route ``body`` first, then the client's later messages
    (a disconnect, which ends a streamed response early)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class _Guard:
    """ASGI middleware: bearer-token check, then the work limits, then the in-flight limit. A
    request holds its ``n`` slots from admission until its response (streamed or not) is fully
    sent or the client is gone."""

    def __init__(self, app: ASGIApp, *, core: ServerCore) -> None:
        self.app = app
        self.config = core.config
        key = core.config.api_key
        self._key = key.encode() if key else None
        self.limit = core.config.max_concurrent_requests
        self.in_flight = 0
        """Sequences of the admitted requests still running."""
        self.metrics = core.metrics

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # compare_digest: the time taken does not tell how much of the key matched
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        is_health = path == "/health" and scope["method"] in ("GET", "HEAD")
        if self._key is not None and not is_health and not self._authorized(scope):
            self.metrics.rejected.labels("unauthorized").inc()
            message = (
                "missing or wrong bearer token: send 'Authorization: Bearer <key>' "
                "(the server's api_key / AGENTLOOP_API_KEY)"
            )
            reply = JSONResponse(
                error_body(message, code=401),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await reply(scope, receive, send)
            return
        if path not in _LIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client is gone: nothing to answer
            return
        receive = _replay(body, receive)
        try:
            scope[_PARSED] = parsed = json.loads(body)
        except (ValueError, RecursionError):  # not JSON: the route answers 400
            parsed = None
        try:
            sequences = request_sequences(path, parsed, self.config)
        except GenerateInputError as exc:
            self.metrics.rejected.labels("over_limit").inc()
            reply = JSONResponse(error_body(str(exc), param=exc.param), status_code=400)
            await reply(scope, receive, send)
            return
        if self.in_flight + sequences > self.limit:
            self.metrics.rejected.labels("overloaded").inc()
            reply = JSONResponse(
                error_body(self._overloaded(sequences, path), code=503),
                status_code=503,
                headers={"Retry-After": "1"},
            )
            await reply(scope, receive, send)
            return
        # no await since the check: admission cannot overshoot the limit
        self.in_flight += sequences
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= sequences

    def _overloaded(self, sequences: int, path: str) -> str:
        if sequences == 1:
            return (
                f"server overloaded: {self.in_flight} requests in flight (limit "
                f"max_concurrent_requests={self.limit}); retry later or raise the limit"
            )
        if path == COMPLETIONS_PATH:  # n per prompt, and a batch of prompts
            return (
                f"server overloaded: {self.in_flight} requests in flight and this one counts as "
                f"{sequences} (n x prompts; the limit max_concurrent_requests={self.limit} "
                "counts each sequence); retry later, send fewer prompts or a lower n, or raise "
                "the limit"
            )
        return (
            f"server overloaded: {self.in_flight} requests in flight and this one counts as "
            f"{sequences} (n={sequences}; the limit max_concurrent_requests={self.limit} counts "
            "each choice); retry later, lower n or raise the limit"
        )


async def _openai_route(
    core: ServerCore, handler: OpenAIHandler | None, what: str, request: Request
) -> Response:
    """One OpenAI completion route: the body to ``handler``, its answer counted in the metrics;
    501 naming ``what`` is not served when the engine has no serving layer for it."""
    if handler is None:
        return JSONResponse(
            error_body(
                f"{what} are not served by the {core.config.backend} backend here; use /generate",
                code=501,
            ),
            status_code=501,
        )
    body = await _json_object(request)
    if isinstance(body, JSONResponse):
        return body
    m = core.metrics
    m.in_flight.inc()
    try:
        status, result = await handler(body)
    finally:
        m.in_flight.dec()
    if status != 200:
        m.errors.labels("bad_request" if status < 500 else "engine").inc()
        return JSONResponse(result, status_code=status)
    if isinstance(result, dict):
        usage = result.get("usage") or {}
        m.prompt_tokens.inc(usage.get("prompt_tokens", 0))
        m.generated_tokens.inc(usage.get("completion_tokens", 0))
        for choice in result.get("choices", []):
            m.requests.labels(choice.get("finish_reason") or "stop").inc()
        return JSONResponse(result)
    return StreamingResponse(result, media_type="text/event-stream")


def _request(body: dict[str, Any], request_id: str | None, priority: int) -> GenerateRequest:
    """The ``/generate`` JSON body (``request_id``: the engine request's, as documented) as a
    typed request; a bad ``sampling_params`` raises ``GenerateInputError`` naming its key."""
    return GenerateRequest(
        prompt_ids=body["prompt_ids"],
        sampling_params=SamplingParams.from_dict(body.get("sampling_params")),
        request_id=request_id,
        priority=priority,
    )


def build_app(
    core: ServerCore,
    chat: OpenAIHandler | None = None,
    completions: OpenAIHandler | None = None,
) -> FastAPI:
    """The routes over ``core``; ``chat`` and ``completions`` serve the OpenAI completion
    routes (None: 501)."""
    app = FastAPI(title="agentloop-rl server", docs_url=None, redoc_url=None)
    app.add_middleware(_Guard, core=core)
    created = int(time.time())

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, JSONResponse):
            return body
        unknown = sorted(set(body) - {"prompt_ids", "sampling_params", "request_id", "priority"})
        if unknown:
            return _bad(
                f"unknown field(s) {', '.join(unknown)}; expected prompt_ids, "
                "sampling_params, request_id, priority",
                param=unknown[0],
            )
        if "prompt_ids" not in body:
            return _bad("prompt_ids is required", param="prompt_ids")
        request_id = body.get("request_id")
        if request_id is not None and not isinstance(request_id, str):
            return _bad("request_id must be a string", param="request_id")
        priority = body.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            return _bad(
                f"priority must be an integer (lower is scheduled first), got {priority!r}",
                param="priority",
            )
        try:
            out = await core.generate(_request(body, request_id, priority))
        except GenerateInputError as exc:
            return _bad(str(exc), param=exc.param)
        return JSONResponse(out.to_dict())

    @app.post(CHAT_PATH)
    async def chat_completions(request: Request) -> Response:
        return await _openai_route(core, chat, "chat completions", request)

    @app.post(COMPLETIONS_PATH)
    async def text_completions(request: Request) -> Response:
        return await _openai_route(core, completions, "text completions", request)

    @app.get("/v1/models")
    async def models() -> Response:
        """The one model this server serves, as OpenAI's model list."""
        card = {
            "id": core.config.model_name,
            "object": "model",
            "created": created,
            "owned_by": "agentloop",
            "root": core.config.model,
            "max_model_len": core.engine.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/health")
    async def health() -> Response:
        try:
            info = await core.engine.health()
        except Exception as exc:  # any failure means unhealthy; say why
            return JSONResponse({"status": "unhealthy", "error": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok", **info})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(core.metrics.text(), media_type="text/plain; version=0.0.4")

    return app


class HttpFront:
    """Runs uvicorn for ``app`` as a task on the current event loop."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the start-up error
            await asyncio.sleep(0.02)
        logger.info("HTTP front on %s", self.url)
        return self.url

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
