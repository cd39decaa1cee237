"""HTTP front of one server: FastAPI routes served by uvicorn on the server's own event loop.

Routes: ``POST /generate`` (token ids in; ids, log-probs, finish reason out), ``POST
/v1/chat/completions`` (OpenAI-compatible, ``tools`` in, ``tool_calls`` out), ``GET /health``,
``GET /metrics`` (Prometheus text). Bad input answers 400 with an OpenAI-style error body.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servers.core import ServerCore
from servers.types import GenerateInputError

__all__ = ["build_app", "HttpFront", "error_body"]

logger = logging.getLogger(__name__)

ChatHandler = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


def error_body(message: str, *, param: str | None = None, code: int = 400) -> dict[str, Any]:
    kind = "invalid_request_error" if code < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _bad(message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, param=param), status_code=400)


async def _json_object(request: Request) -> dict[str, Any] | JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return _bad("request body must be JSON")
    if not isinstance(body, dict):
        return _bad("request body must be a JSON object")
    return body


def build_app(core: ServerCore, chat: ChatHandler | None = None) -> FastAPI:
    app = FastAPI(title="agentloop-rl server", docs_url=None, redoc_url=None)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, JSONResponse):
            return body
        unknown = sorted(set(body) - {"prompt_ids", "sampling_params", "request_id"})
        if unknown:
            return _bad(
                f"unknown field(s) {', '.join(unknown)}; expected prompt_ids, "
                "sampling_params, request_id",
                param=unknown[0],
            )
        if "prompt_ids" not in body:
            return _bad("prompt_ids is required", param="prompt_ids")
        request_id = body.get("request_id")
        if request_id is not None and not isinstance(request_id, str):
            return _bad("request_id must be a string", param="request_id")
        try:
            out = await core.generate(body["prompt_ids"], body.get("sampling_params"), request_id)
        except GenerateInputError as exc:
            return _bad(str(exc), param=exc.param)
        return JSONResponse(out.to_dict())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        if chat is None:
            return JSONResponse(
                error_body(
                    f"chat completions are not served by the {core.config.backend} "
                    "backend here; use /generate",
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
            status, result = await chat(body)
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
