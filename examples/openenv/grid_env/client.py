"""``GridEnv``: the OpenEnv client of the grid environment (one WebSocket session per instance).

Async by default; ``GridEnv(base_url=...).sync()`` gives the blocking wrapper::

    async with GridEnv(base_url="http://127.0.0.1:8000") as env:
        result = await env.reset(seed=3)
        result = await env.step(GridAction(move="up"))
"""

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import GridAction, GridObservation, GridState


class GridEnv(EnvClient[GridAction, GridObservation, GridState]):
    """Client for ``examples.openenv.grid_env.server``."""

    def _step_payload(self, action: GridAction) -> dict[str, Any]:
        return {"move": action.move}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GridObservation]:
        reward, done = payload.get("reward"), payload.get("done", False)
        observation = GridObservation.model_validate(
            {**payload.get("observation", {}), "reward": reward, "done": done}
        )
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> GridState:
        return GridState.model_validate(payload)
