"""The tools page: a tool config loaded as training loads it, each tool called from its form
as an agent loop calls it; the same actions as JSON under ``/api/tools``."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from trainer.studio.routes.common import StudioDep, api_error, form_strings, render
from trainer.studio.state import Studio

__all__ = ["parse_arguments", "router"]

router = APIRouter()

_TYPES = {"integer": int, "number": float}


def parse_arguments(form: dict[str, str], parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool form's ``arg:<name>`` fields as the call's arguments, each typed by the schema
    (empty fields left out); raises ValueError naming the argument."""
    properties = parameters.get("properties") or {}
    out: dict[str, Any] = {}
    for key, raw in form.items():
        if not key.startswith("arg:") or raw == "":
            continue
        name = key[4:]
        kind = (properties.get(name) or {}).get("type", "string")
        try:
            if kind in _TYPES:
                out[name] = _TYPES[kind](raw)
            elif kind == "boolean":
                out[name] = {"true": True, "false": False}[raw.strip().lower()]
            elif kind in ("object", "array"):
                out[name] = json.loads(raw)
            else:
                out[name] = raw
        except (ValueError, KeyError, json.JSONDecodeError):
            raise ValueError(f"argument {name!r} must be {kind}, got {raw!r}") from None
    return out


def tools_page(studio: Studio, status: int = 200, **context: Any) -> HTMLResponse:
    bench = studio.tools
    views = bench.describe() if bench else []
    return render(studio, "tools", "tools", status, bench=bench, views=views, **context)


# ---- the page ---------------------------------------------------------------------------------
@router.get("/tools", response_class=HTMLResponse)
def page(studio: StudioDep) -> Response:
    return tools_page(studio)


@router.post("/tools/load", response_class=HTMLResponse)
async def load(request: Request, studio: StudioDep) -> Response:
    form = await request.form()
    try:
        await run_in_threadpool(studio.load_tools, str(form.get("path", "")))
    except ValueError as exc:
        return tools_page(studio, 400, error=str(exc))
    return tools_page(studio)


@router.post("/tools/call", response_class=HTMLResponse)
async def call(request: Request, studio: StudioDep) -> Response:
    form = await form_strings(request)
    bench = studio.tools
    try:
        if bench is None:
            raise ValueError("load a tool config first")
        name = form.get("name", "")
        tool = bench.tools.get(name)
        parameters = tool.tool_schema.get("function", {}).get("parameters", {}) if tool else {}
        view = await bench.call(name, parse_arguments(form, parameters))
    except ValueError as exc:
        return tools_page(studio, 400, error=str(exc))
    return tools_page(studio, call=view)


@router.post("/tools/close")
def close(studio: StudioDep) -> Response:
    studio.close_tools()
    return RedirectResponse("/tools", status_code=303)


# ---- the JSON API -----------------------------------------------------------------------------
@router.post("/api/tools/load", response_model=None)
async def api_load(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        await run_in_threadpool(studio.load_tools, str(body.get("path", "")))
    except ValueError as exc:
        return api_error(exc)
    assert studio.tools is not None
    return {"tools": [asdict(v) for v in studio.tools.describe()]}


@router.get("/api/tools", response_model=None)
def api_tools(studio: StudioDep) -> dict[str, Any]:
    bench = studio.tools
    return {"tools": [asdict(v) for v in bench.describe()] if bench else []}


@router.post("/api/tools/call", response_model=None)
async def api_call(body: dict[str, Any], studio: StudioDep) -> dict[str, Any] | JSONResponse:
    try:
        if studio.tools is None:
            raise ValueError("load a tool config first")
        view = await studio.tools.call(
            str(body.get("name", "")),
            dict(body.get("arguments") or {}),
            dict(body.get("create_kwargs") or {}),
        )
    except ValueError as exc:
        return api_error(exc)
    return asdict(view)
