"""The reward page: a reward file loaded and checked as training loads it, tried on a pasted
row and answer; the same actions as JSON under ``/api/reward``."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse

from trainer.studio.routes.common import StudioDep, api_error, render

__all__ = ["EXAMPLE_ROW", "parse_row", "router"]

router = APIRouter()

EXAMPLE_ROW = json.dumps(
    {"data_source": "my_task", "reward_model": {"ground_truth": "42"}, "extra_info": {}}
)
"""The row the page's form starts with: the keys a reward function is called with."""


def parse_row(text: str) -> dict[str, Any]:
    """The form's row text as a JSON object (empty: ``{}``); raises ValueError saying why not."""
    try:
        row = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"the row is not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise ValueError("the row must be a JSON object")
    return row


# ---- the page ---------------------------------------------------------------------------------
@router.get("/reward", response_class=HTMLResponse)
def page(studio: StudioDep) -> Response:
    return render(studio, "reward", "reward", bench=studio.reward, row=EXAMPLE_ROW, answer="")


@router.post("/reward/load", response_class=HTMLResponse)
async def load(request: Request, studio: StudioDep) -> Response:
    form = await request.form()
    try:
        studio.load_reward(str(form.get("path", "")), str(form.get("name") or "compute_score"))
    except ValueError as exc:
        return render(studio, "reward", "reward", 400, bench=None, error=str(exc), row=EXAMPLE_ROW)
    return render(studio, "reward", "reward", bench=studio.reward, row=EXAMPLE_ROW, answer="")


@router.post("/reward/score", response_class=HTMLResponse)
async def score(request: Request, studio: StudioDep) -> Response:
    form = await request.form()
    row_text, answer = str(form.get("row", "")), str(form.get("answer", ""))
    context = {"bench": studio.reward, "row": row_text, "answer": answer}
    try:
        view = await run_in_threadpool(studio.score, parse_row(row_text), answer)
    except ValueError as exc:
        return render(studio, "reward", "reward", 400, error=str(exc), **context)
    return render(studio, "reward", "reward", view=view, **context)


# ---- the JSON API -----------------------------------------------------------------------------
@router.post("/api/reward/load", response_model=None)
def api_load(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        studio.load_reward(str(body.get("path", "")), str(body.get("name") or "compute_score"))
    except ValueError as exc:
        return api_error(exc)
    assert studio.reward is not None
    return {"path": studio.reward.path, "name": studio.reward.name}


@router.post("/api/reward/score", response_model=None)
def api_score(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        view = studio.score(dict(body.get("row") or {}), str(body.get("answer", "")))
    except ValueError as exc:
        return api_error(exc)
    return asdict(view)
