"""The train page: the form checked by ``agentloop-train``'s config code and written as its
config file, a run started as that command and followed step by step; the same actions as
JSON under ``/api/train``."""

from __future__ import annotations

import shlex
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from trainer.studio.routes.common import StudioDep, api_error, form_strings, render, strings
from trainer.studio.state import Studio
from trainer.studio.train import FIELDS, reward_curve

__all__ = ["router"]

router = APIRouter()


def train_page(
    studio: Studio, status: int = 200, settings: dict[str, str] | None = None, **context: Any
) -> HTMLResponse:
    """The form (as posted, else the run's) and the run's steps and reward curve; the page
    refreshes itself every 3 s while the run goes on."""
    job = studio.train
    points = job.steps() if job else []
    return render(
        studio,
        "train",
        "train",
        status,
        fields=FIELDS,
        settings=settings or (job.settings if job else {}),
        job=job,
        points=points,
        curve=reward_curve(points),
        traces=job.traces_command if job else "",
        refresh=3 if job and job.running else None,
        **context,
    )


# ---- the page ---------------------------------------------------------------------------------
@router.get("/train", response_class=HTMLResponse)
def page(studio: StudioDep) -> Response:
    return train_page(studio)


@router.post("/train/check", response_class=HTMLResponse)
async def check(request: Request, studio: StudioDep) -> Response:
    settings = await form_strings(request)
    try:
        file, command = await run_in_threadpool(studio.check_train, settings)
    except ValueError as exc:
        return train_page(studio, 400, settings, error=str(exc))
    checked = {"file": file, "command": shlex.join(command)}
    return train_page(studio, settings=settings, checked=checked)


@router.post("/train/start", response_class=HTMLResponse)
async def start(request: Request, studio: StudioDep) -> Response:
    settings = await form_strings(request)
    try:
        await run_in_threadpool(studio.start_train, settings)
    except ValueError as exc:
        return train_page(studio, 400, settings, error=str(exc))
    return RedirectResponse("/train", status_code=303)


@router.post("/train/stop")
def stop(studio: StudioDep) -> Response:
    if studio.train is not None:
        studio.train.stop()
    return RedirectResponse("/train", status_code=303)


# ---- the JSON API -----------------------------------------------------------------------------
@router.post("/api/train/check", response_model=None)
def api_check(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        file, command = studio.check_train(strings(body))
    except ValueError as exc:
        return api_error(exc)
    return {"config_file": str(file), "command": command}


@router.post("/api/train/start", response_model=None)
def api_start(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        return studio.start_train(strings(body)).status()
    except ValueError as exc:
        return api_error(exc)


@router.get("/api/train", response_model=None)
def api_status(studio: StudioDep) -> dict[str, Any]:
    job = studio.train
    return job.status() if job else {"running": False, "steps": []}


@router.post("/api/train/stop", response_model=None)
def api_stop(studio: StudioDep) -> dict[str, Any] | JSONResponse:
    if studio.train is None:
        return api_error(ValueError("no run was started here"))
    studio.train.stop()
    return studio.train.status()
