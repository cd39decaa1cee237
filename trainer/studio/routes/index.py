"""The front door: the index page, and with a ``token`` the check every request passes (a
bearer header, or the cookie the login form sets)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from trainer.studio.routes.common import StudioDep, render

__all__ = ["COOKIE", "LOGIN", "check_token", "router"]

COOKIE = "studio_token"
LOGIN = """<!doctype html><html><body><h1>agentloop studio</h1>
<p>This studio was started with a token (it listens beyond this machine). Enter it:</p>
<form method="post" action="/login"><input type="password" name="token" id="token">
<button type="submit">open</button></form></body></html>"""

router = APIRouter()


async def check_token(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    """HTTP middleware: without ``app.state.token`` every request passes; with it, a request
    without it gets 401 (JSON under ``/api/``, the login page elsewhere)."""
    token: str | None = request.app.state.token
    if token is None or request.url.path == "/login":
        return await call_next(request)
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    given = given or request.cookies.get(COOKIE, "")
    if given and hmac.compare_digest(given, token):
        return await call_next(request)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": "this studio needs its token"}, status_code=401)
    return HTMLResponse(LOGIN, status_code=401)


@router.post("/login")
async def login(request: Request) -> RedirectResponse:
    form = await request.form()
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, str(form.get("token", "")), httponly=True, samesite="strict")
    return response


@router.get("/", response_class=HTMLResponse)
def index(studio: StudioDep) -> HTMLResponse:
    return render(studio, "index", "studio")
