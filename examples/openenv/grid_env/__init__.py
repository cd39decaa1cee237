"""A 4x4 grid-walk environment written against OpenEnv's (openenv-core 0.3.0) own API.

``models`` holds the wire types, ``server`` the Environment and its FastAPI ``app``, ``client``
the ``GridEnv`` EnvClient. Start a server with
``python -m examples.openenv.grid_env.server --port 8000``.
"""

from .client import GridEnv
from .models import GridAction, GridObservation, GridState

__all__ = ["GridAction", "GridEnv", "GridObservation", "GridState"]
