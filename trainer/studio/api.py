"""The studio's JSON API under ``/api``: the pages' actions for scripts and tests. A bad input
is HTTP 400 with ``{"error": <the CLI's text>}``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from trainer.studio.state import Studio

__all__ = ["api_router"]


def _error(exc: Exception) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=400)


def _strings(body: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in body.items()}


def api_router(studio: Studio) -> APIRouter:
    api = APIRouter(prefix="/api")

    @api.post("/tools/load")
    async def tools_load(body: dict[str, Any]):
        try:
            await run_in_threadpool(studio.load_tools, str(body.get("path", "")))
        except ValueError as exc:
            return _error(exc)
        assert studio.tools is not None
        return {"tools": [asdict(v) for v in studio.tools.describe()]}

    @api.get("/tools")
    def tools():
        bench = studio.tools
        return {"tools": [asdict(v) for v in bench.describe()] if bench else []}

    @api.post("/tools/call")
    async def tools_call(body: dict[str, Any]):
        try:
            if studio.tools is None:
                raise ValueError("load a tool config first")
            call = await studio.tools.call(
                str(body.get("name", "")),
                dict(body.get("arguments") or {}),
                dict(body.get("create_kwargs") or {}),
            )
        except ValueError as exc:
            return _error(exc)
        return asdict(call)

    @api.post("/reward/load")
    def reward_load(body: dict[str, Any]):
        try:
            studio.load_reward(str(body.get("path", "")), str(body.get("name") or "compute_score"))
        except ValueError as exc:
            return _error(exc)
        assert studio.reward is not None
        return {"path": studio.reward.path, "name": studio.reward.name}

    @api.post("/reward/score")
    def reward_score(body: dict[str, Any]):
        try:
            view = studio.score(dict(body.get("row") or {}), str(body.get("answer", "")))
        except ValueError as exc:
            return _error(exc)
        return asdict(view)

    @api.post("/preview/start")
    def preview_start(body: dict[str, Any]):
        try:
            return studio.start_preview(_strings(body)).status()
        except ValueError as exc:
            return _error(exc)

    @api.get("/preview")
    def preview():
        job = studio.preview
        return job.status() if job else {"running": False, "samples": []}

    @api.post("/preview/cancel")
    def preview_cancel():
        if studio.preview is None:
            return _error(ValueError("no preview was started here"))
        studio.preview.cancel()
        return studio.preview.status()

    @api.post("/train/check")
    def train_check(body: dict[str, Any]):
        try:
            file, command = studio.check_train(_strings(body))
        except ValueError as exc:
            return _error(exc)
        return {"config_file": str(file), "command": command}

    @api.post("/train/start")
    def train_start(body: dict[str, Any]):
        try:
            return studio.start_train(_strings(body)).status()
        except ValueError as exc:
            return _error(exc)

    @api.get("/train")
    def train():
        job = studio.train
        return job.status() if job else {"running": False, "steps": []}

    @api.post("/train/stop")
    def train_stop():
        if studio.train is None:
            return _error(ValueError("no run was started here"))
        studio.train.stop()
        return studio.train.status()

    return api
