"""What every page's router shares: the app's ``Studio`` as a dependency, a page rendered
with the tools and reward the studio holds, and the JSON API's error shape."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse
from jinja2 import DictLoader, Environment, select_autoescape

from trainer.studio.state import Studio
from trainer.studio.templates import PAGES

__all__ = ["StudioDep", "api_error", "form_strings", "render", "strings", "studio_of"]

_PAGES = Environment(loader=DictLoader(PAGES), autoescape=select_autoescape(default=True))


def studio_of(request: Request) -> Studio:
    """The studio ``create_app`` put on ``app.state`` (one per app: one user, one process)."""
    return request.app.state.studio


StudioDep = Annotated[Studio, Depends(studio_of)]
"""A route's parameter that receives the app's studio."""


def render(
    studio: Studio, name: str, title: str, status: int = 200, **context: Any
) -> HTMLResponse:
    """Template ``name``; every page shows what tools and reward file are loaded (the nav)."""
    context.setdefault("tools", studio.tools)
    context.setdefault("reward", studio.reward)
    html = _PAGES.get_template(name).render(title=title, **context)
    return HTMLResponse(html, status_code=status)


async def form_strings(request: Request) -> dict[str, str]:
    """A posted form's fields as strings (what the settings checks take)."""
    return {k: str(v) for k, v in (await request.form()).items()}


def api_error(exc: Exception) -> JSONResponse:
    """A bad input through the API: HTTP 400 with ``{"error": <the CLI's text>}``."""
    return JSONResponse({"error": str(exc)}, status_code=400)


def strings(body: dict[str, Any]) -> dict[str, str]:
    """A JSON body's values as strings, as a form would post them."""
    return {k: str(v) for k, v in body.items()}
