"""The studio's web app: pages (forms posted back, rendered on the server) and the same actions
as a JSON API under ``/api``. One user, one process: the loaded tool config and reward file
are the app's state. With a ``token`` every request must carry it (a bearer header, or the
cookie the page's token form sets)."""

from __future__ import annotations

import hmac
import json
import shlex
import time
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from jinja2 import DictLoader, Environment, select_autoescape

from trainer.studio.reward import RewardBench
from trainer.studio.templates import PAGES
from trainer.studio.tools import ToolBench
from trainer.studio.train import FIELDS, TrainJob, check_settings, reward_curve

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


def create_app(token: str | None = None) -> FastAPI:
    state: dict[str, Any] = {"tools": None, "reward": None, "train": None}

    def _close_tools() -> None:
        if state["tools"] is not None:
            state["tools"].close()
            state["tools"] = None

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        _close_tools()  # MCP servers started from the page stop with it
        if state["train"] is not None:
            state["train"].stop()  # a run started here ends with a checkpoint

    app = FastAPI(title="agentloop studio", docs_url=None, redoc_url=None, lifespan=lifespan)
    pages = Environment(loader=DictLoader(PAGES), autoescape=select_autoescape(default=True))
    app.state.studio = state

    def page(name: str, title: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = pages.get_template(name).render(title=title, **state, **context)
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
        bench: ToolBench | None = state["tools"]
        views = bench.describe() if bench else []
        return page("tools", "tools", status, bench=bench, views=views, **context)

    @app.post("/tools/load", response_class=HTMLResponse)
    async def tools_load(request: Request):
        form = await request.form()
        try:
            await run_in_threadpool(_load_tools, str(form.get("path", "")))
        except ValueError as exc:
            return _tools_page(400, error=str(exc))
        return _tools_page()

    @app.post("/tools/call", response_class=HTMLResponse)
    async def tools_call(request: Request):
        form = {k: str(v) for k, v in (await request.form()).items()}
        bench: ToolBench | None = state["tools"]
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
        _close_tools()
        return RedirectResponse("/tools", status_code=303)

    @app.get("/reward", response_class=HTMLResponse)
    def reward_page():
        return page("reward", "reward", bench=state["reward"], row=EXAMPLE_ROW, answer="")

    @app.post("/reward/load", response_class=HTMLResponse)
    async def reward_load(request: Request):
        form = await request.form()
        try:
            _load_reward(str(form.get("path", "")), str(form.get("name") or "compute_score"))
        except ValueError as exc:
            return page("reward", "reward", 400, bench=None, error=str(exc), row=EXAMPLE_ROW)
        return page("reward", "reward", bench=state["reward"], row=EXAMPLE_ROW, answer="")

    @app.post("/reward/score", response_class=HTMLResponse)
    async def reward_score(request: Request):
        form = await request.form()
        row_text, answer = str(form.get("row", "")), str(form.get("answer", ""))
        context = {"bench": state["reward"], "row": row_text, "answer": answer}
        try:
            view = await run_in_threadpool(_score, _row(row_text), answer)
        except ValueError as exc:
            return page("reward", "reward", 400, error=str(exc), **context)
        return page("reward", "reward", view=view, **context)

    @app.get("/train", response_class=HTMLResponse)
    def train_page():
        return _train_page()

    def _train_page(status: int = 200, settings: dict[str, str] | None = None, **context: Any):
        job: TrainJob | None = state["train"]
        points = job.steps() if job else []
        return page(
            "train",
            "train",
            status,
            fields=FIELDS,
            settings=settings or {},
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
            file, command = await run_in_threadpool(_check_train, settings)
        except ValueError as exc:
            return _train_page(400, settings, error=str(exc))
        checked = {"file": file, "command": shlex.join(command)}
        return _train_page(settings=settings, checked=checked)

    @app.post("/train/start", response_class=HTMLResponse)
    async def train_start(request: Request):
        settings = {k: str(v) for k, v in (await request.form()).items()}
        try:
            await run_in_threadpool(_start_train, settings)
        except ValueError as exc:
            return _train_page(400, settings, error=str(exc))
        return RedirectResponse("/train", status_code=303)

    @app.post("/train/stop")
    def train_stop():
        if state["train"] is not None:
            state["train"].stop()
        return RedirectResponse("/train", status_code=303)

    # ---- JSON API --------------------------------------------------------------------------
    @app.post("/api/tools/load")
    async def api_tools_load(body: dict[str, Any]):
        try:
            await run_in_threadpool(_load_tools, str(body.get("path", "")))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return {"tools": [asdict(v) for v in state["tools"].describe()]}

    @app.get("/api/tools")
    def api_tools():
        bench: ToolBench | None = state["tools"]
        return {"tools": [asdict(v) for v in bench.describe()] if bench else []}

    @app.post("/api/tools/call")
    async def api_tools_call(body: dict[str, Any]):
        bench: ToolBench | None = state["tools"]
        try:
            if bench is None:
                raise ValueError("load a tool config first")
            call = await bench.call(
                str(body.get("name", "")),
                dict(body.get("arguments") or {}),
                dict(body.get("create_kwargs") or {}),
            )
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return asdict(call)

    @app.post("/api/reward/load")
    def api_reward_load(body: dict[str, Any]):
        try:
            _load_reward(str(body.get("path", "")), str(body.get("name") or "compute_score"))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return {"path": state["reward"].path, "name": state["reward"].name}

    @app.post("/api/reward/score")
    def api_reward_score(body: dict[str, Any]):
        if state["reward"] is None:
            return JSONResponse({"error": "load a reward file first"}, status_code=400)
        return asdict(_score(dict(body.get("row") or {}), str(body.get("answer", ""))))

    @app.post("/api/train/check")
    def api_train_check(body: dict[str, Any]):
        try:
            file, command = _check_train({k: str(v) for k, v in body.items()})
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return {"config_file": str(file), "command": command}

    @app.post("/api/train/start")
    def api_train_start(body: dict[str, Any]):
        try:
            _start_train({k: str(v) for k, v in body.items()})
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return state["train"].status()

    @app.get("/api/train")
    def api_train():
        job: TrainJob | None = state["train"]
        return job.status() if job else {"running": False, "steps": []}

    @app.post("/api/train/stop")
    def api_train_stop():
        job: TrainJob | None = state["train"]
        if job is None:
            return JSONResponse({"error": "no run was started here"}, status_code=400)
        job.stop()
        return job.status()

    # ---- actions -----------------------------------------------------------------------------
    def _run_dir(settings: dict[str, str]) -> Path:
        given = settings.get("trainer.default_local_dir", "").strip()
        if not given:
            given = str(Path("studio_runs") / time.strftime("%Y%m%d-%H%M%S"))
            settings["trainer.default_local_dir"] = given
        return Path(given).expanduser().resolve()

    def _check_train(settings: dict[str, str]) -> tuple[Path, list[str]]:
        return check_settings(settings, _run_dir(settings))

    def _start_train(settings: dict[str, str]) -> None:
        running: TrainJob | None = state["train"]
        if running is not None and running.running:
            raise ValueError(f"a run is in progress ({running.run_dir}): stop it first")
        run_dir = _run_dir(settings)
        file, command = check_settings(settings, run_dir)
        state["train"] = TrainJob(command, file, run_dir)

    def _load_tools(path: str) -> None:
        if not path:
            raise ValueError("give the path of a tool config")
        bench = ToolBench(path)  # a bad file leaves the loaded tools as they were
        _close_tools()
        state["tools"] = bench

    def _load_reward(path: str, name: str) -> None:
        if not path:
            raise ValueError("give the path of a reward file")
        state["reward"] = RewardBench(path, name)

    def _score(row: dict[str, Any], answer: str):
        if state["reward"] is None:
            raise ValueError("load a reward file first")
        return state["reward"].score(row, answer)

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
