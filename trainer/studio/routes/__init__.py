"""The studio's routes, one router per page: each module holds its page's form actions and
the same actions as JSON under ``/api``, both calling the app's ``Studio`` (``app.state``)."""

from trainer.studio.routes import index, preview, reward, tools, train

__all__ = ["ROUTERS"]

ROUTERS = (index.router, tools.router, reward.router, preview.router, train.router)
"""Every page's router, in the order of the pages' links."""
