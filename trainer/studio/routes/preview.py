"""The preview page: a few rows through the real servers and agent loops (an
``agentloop-rollout`` child), shown turn by turn while it runs; the same actions as JSON under
``/api/preview``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from trainer.studio.preview import PREVIEW_FIELDS
from trainer.studio.routes.common import StudioDep, api_error, form_strings, render, strings
from trainer.studio.state import Studio

__all__ = ["router"]

router = APIRouter()


def preview_page(
    studio: Studio, status: int = 200, settings: dict[str, str] | None = None, **context: Any
) -> HTMLResponse:
    """The form (as posted, else the preview's, else the defaults) and the preview's samples;
    the page refreshes itself every 2 s while the preview runs."""
    job = studio.preview
    views, note = job.views() if job else ([], None)
    return render(
        studio,
        "preview",
        "preview",
        status,
        fields=PREVIEW_FIELDS,
        settings=settings or (job.settings if job else studio.preview_defaults()),
        job=job,
        views=views,
        advantage_note=note,
        progress=job.progress() if job else None,
        refresh=2 if job and job.running else None,
        **context,
    )


# ---- the page ---------------------------------------------------------------------------------
@router.get("/preview", response_class=HTMLResponse)
def page(studio: StudioDep) -> Response:
    return preview_page(studio)


@router.post("/preview/start", response_class=HTMLResponse)
async def start(request: Request, studio: StudioDep) -> Response:
    settings = await form_strings(request)
    try:
        await run_in_threadpool(studio.start_preview, settings)
    except ValueError as exc:
        return preview_page(studio, 400, settings, error=str(exc))
    return RedirectResponse("/preview", status_code=303)


@router.post("/preview/cancel")
def cancel(studio: StudioDep) -> Response:
    if studio.preview is not None:
        studio.preview.cancel()
    return RedirectResponse("/preview", status_code=303)


# ---- the JSON API -----------------------------------------------------------------------------
@router.post("/api/preview/start", response_model=None)
def api_start(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        return studio.start_preview(strings(body)).status()
    except ValueError as exc:
        return api_error(exc)


@router.get("/api/preview", response_model=None)
def api_status(studio: StudioDep) -> dict[str, Any]:
    job = studio.preview
    return job.status() if job else {"running": False, "samples": []}


@router.post("/api/preview/cancel", response_model=None)
def api_cancel(studio: StudioDep) -> dict[str, Any] | JSONResponse:
    if studio.preview is None:
        return api_error(ValueError("no preview was started here"))
    studio.preview.cancel()
    return studio.preview.status()
