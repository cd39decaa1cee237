"""The studio's web app: pages (forms posted back, rendered on the server); the same actions
are a JSON API under ``/api`` (``trainer.studio.api``). One user, one process: the loaded tool
config and reward file, the preview and the run are the app's ``Studio``. With a ``token``
every request must carry it (a bearer header, or the cookie the page's token form sets)."""

from __future__ import annotations

import hmac
import json
import shlex
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from jinja2 import DictLoader, Environment, select_autoescape

from trainer.studio.api import api_router
from trainer.studio.preview import PREVIEW_FIELDS
from trainer.studio.state import Studio
from trainer.studio.templates import PAGES
from trainer.studio.train import FIELDS, reward_curve

__all__ = ["create_app", "parse_arguments"]

COOKIE = "studio_token"
LOGIN = """<!doctype html><html><body><h1>agentloop studio</h1>
<p>This studio was started with a token (it listens beyond this machine). Enter it:</p>
<form method="post" action="/login"><input type="password" name="token" id="token">
<button type="submit">open</button></form></body></html>"""

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


def create_app(token: str | None = None, runs_dir: str | Path = "studio_runs") -> FastAPI:
    """The studio; previews and runs without a folder of their own go under ``runs_dir``."""
    studio = Studio(runs_dir)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        studio.close()  # MCP servers stop; a run ends with a checkpoint; a preview is cancelled

    app = FastAPI(title="agentloop studio", docs_url=None, redoc_url=None, lifespan=lifespan)
    pages = Environment(loader=DictLoader(PAGES), autoescape=select_autoescape(default=True))
    app.state.studio = studio
    app.include_router(api_router(studio))

    def page(name: str, title: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("tools", studio.tools)
        context.setdefault("reward", studio.reward)
        html = pages.get_template(name).render(title=title, **context)
        return HTMLResponse(html, status_code=status)

    @app.middleware("http")
    async def check_token(request: Request, call_next):
        if token is None or request.url.path == "/login":
            return await call_next(request)
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        given = given or request.cookies.get(COOKIE, "")
        if given and hmac.compare_digest(given, token):
            return await call_next(request)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "this studio needs its token"}, status_code=401)
        return HTMLResponse(LOGIN, status_code=401)

    @app.post("/login")
    async def login(request: Request):
        form = await request.form()
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, str(form.get("token", "")), httponly=True, samesite="strict")
        return response

    # ---- pages -----------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    def index():
        return page("index", "studio")

    @app.get("/tools", response_class=HTMLResponse)
    def tools_page():
        return _tools_page()

    def _tools_page(status: int = 200, **context: Any) -> HTMLResponse:
        bench = studio.tools
        views = bench.describe() if bench else []
        return page("tools", "tools", status, bench=bench, views=views, **context)

    @app.post("/tools/load", response_class=HTMLResponse)
    async def tools_load(request: Request):
        form = await request.form()
        try:
            await run_in_threadpool(studio.load_tools, str(form.get("path", "")))
        except ValueError as exc:
            return _tools_page(400, error=str(exc))
        return _tools_page()

    @app.post("/tools/call", response_class=HTMLResponse)
    async def tools_call(request: Request):
        form = {k: str(v) for k, v in (await request.form()).items()}
        bench = studio.tools
        try:
            if bench is None:
                raise ValueError("load a tool config first")
            name = form.get("name", "")
            tool = bench.tools.get(name)
            parameters = tool.tool_schema.get("function", {}).get("parameters", {}) if tool else {}
            call = await bench.call(name, parse_arguments(form, parameters))
        except ValueError as exc:
            return _tools_page(400, error=str(exc))
        return _tools_page(call=call)

    @app.post("/tools/close")
    def tools_close():
        studio.close_tools()
        return RedirectResponse("/tools", status_code=303)

    @app.get("/reward", response_class=HTMLResponse)
    def reward_page():
        return page("reward", "reward", bench=studio.reward, row=EXAMPLE_ROW, answer="")

    @app.post("/reward/load", response_class=HTMLResponse)
    async def reward_load(request: Request):
        form = await request.form()
        try:
            studio.load_reward(str(form.get("path", "")), str(form.get("name") or "compute_score"))
        except ValueError as exc:
            return page("reward", "reward", 400, bench=None, error=str(exc), row=EXAMPLE_ROW)
        return page("reward", "reward", bench=studio.reward, row=EXAMPLE_ROW, answer="")

    @app.post("/reward/score", response_class=HTMLResponse)
    async def reward_score(request: Request):
        form = await request.form()
        row_text, answer = str(form.get("row", "")), str(form.get("answer", ""))
        context = {"bench": studio.reward, "row": row_text, "answer": answer}
        try:
            view = await run_in_threadpool(studio.score, _row(row_text), answer)
        except ValueError as exc:
            return page("reward", "reward", 400, error=str(exc), **context)
        return page("reward", "reward", view=view, **context)

    @app.get("/preview", response_class=HTMLResponse)
    def preview_page():
        return _preview_page()

    def _preview_page(status: int = 200, settings: dict[str, str] | None = None, **context: Any):
        job = studio.preview
        views, note = job.views() if job else ([], None)
        return page(
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

    @app.post("/preview/start", response_class=HTMLResponse)
    async def preview_start(request: Request):
        settings = {k: str(v) for k, v in (await request.form()).items()}
        try:
            await run_in_threadpool(studio.start_preview, settings)
        except ValueError as exc:
            return _preview_page(400, settings, error=str(exc))
        return RedirectResponse("/preview", status_code=303)

    @app.post("/preview/cancel")
    def preview_cancel():
        if studio.preview is not None:
            studio.preview.cancel()
        return RedirectResponse("/preview", status_code=303)

    @app.get("/train", response_class=HTMLResponse)
    def train_page():
        return _train_page()

    def _train_page(status: int = 200, settings: dict[str, str] | None = None, **context: Any):
        job = studio.train
        points = job.steps() if job else []
        return page(
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

    @app.post("/train/check", response_class=HTMLResponse)
    async def train_check(request: Request):
        settings = {k: str(v) for k, v in (await request.form()).items()}
        try:
            file, command = await run_in_threadpool(studio.check_train, settings)
        except ValueError as exc:
            return _train_page(400, settings, error=str(exc))
        checked = {"file": file, "command": shlex.join(command)}
        return _train_page(settings=settings, checked=checked)

    @app.post("/train/start", response_class=HTMLResponse)
    async def train_start(request: Request):
        settings = {k: str(v) for k, v in (await request.form()).items()}
        try:
            await run_in_threadpool(studio.start_train, settings)
        except ValueError as exc:
            return _train_page(400, settings, error=str(exc))
        return RedirectResponse("/train", status_code=303)

    @app.post("/train/stop")
    def train_stop():
        if studio.train is not None:
            studio.train.stop()
        return RedirectResponse("/train", status_code=303)

    return app


EXAMPLE_ROW = json.dumps(
    {"data_source": "my_task", "reward_model": {"ground_truth": "42"}, "extra_info": {}}
)


def _row(text: str) -> dict[str, Any]:
    try:
        row = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"the row is not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise ValueError("the row must be a JSON object")
    return row
