"""The studio's web app: pages (forms posted back, rendered on the server) and the same
actions as a JSON API under ``/api``, one router per page (``trainer.studio.routes``). One
user, one process: the loaded tool config and reward file, the preview and the run are the
app's ``Studio`` (``app.state.studio``, which the routes receive as a dependency). With a
``token`` every request must carry it (a bearer header, or the cookie the page's token form
sets)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from trainer.studio.routes import ROUTERS
from trainer.studio.routes.index import check_token
from trainer.studio.state import Studio

__all__ = ["create_app"]


def create_app(token: str | None = None, runs_dir: str | Path = "studio_runs") -> FastAPI:
    """The studio; previews and runs without a folder of their own go under ``runs_dir``."""
    studio = Studio(runs_dir)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        studio.close()  # MCP servers stop; a run ends with a checkpoint; a preview is cancelled

    app = FastAPI(title="agentloop studio", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.studio, app.state.token = studio, token
    app.middleware("http")(check_token)
    for router in ROUTERS:
        app.include_router(router)
    return app
