"""The grid environment's server: the Environment subclass and its OpenEnv FastAPI app.

Run it with ``python -m examples.openenv.grid_env.server --host 127.0.0.1 --port 8000`` or
``uvicorn examples.openenv.grid_env.server:app``.
"""

import argparse
import random
import uuid
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from .models import GridAction, GridObservation, GridState

SIZE = 4
MAX_STEPS = 12
GOAL_REWARD = 1.0
STEP_REWARD = -0.05
CORNERS = [(0, 0), (0, SIZE - 1), (SIZE - 1, 0), (SIZE - 1, SIZE - 1)]
DELTAS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class GridEnvironment(Environment[GridAction, GridObservation, GridState]):
    """Walk from a corner to the goal on a 4x4 grid.

    ``reset(seed)`` picks the start corner and the goal cell (any other cell) from ``seed``.
    Each move earns -0.05 (a move into a wall leaves the agent in place and costs the same);
    the move that reaches the goal earns +1.0 and ends the episode, which also ends after 12
    moves. A step after the end raises (the server answers with an error). Every instance is
    independent, so each WebSocket session gets its own.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.reset()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GridObservation:
        rng = random.Random(seed)
        agent = rng.choice(CORNERS)
        goal = rng.choice([(r, c) for r in range(SIZE) for c in range(SIZE) if (r, c) != agent])
        self._state = GridState(
            episode_id=episode_id or str(uuid.uuid4()), step_count=0, agent=agent, goal=goal
        )
        return self._observe(f"Reach G from A in at most {MAX_STEPS} moves.", reward=None)

    def step(
        self, action: GridAction, timeout_s: float | None = None, **kwargs: Any
    ) -> GridObservation:
        s = self._state
        if s.done:
            raise RuntimeError("episode is over; send reset")
        dr, dc = DELTAS[action.move]
        row, col = s.agent[0] + dr, s.agent[1] + dc
        inside = 0 <= row < SIZE and 0 <= col < SIZE
        if inside:
            s.agent = (row, col)
        s.step_count += 1
        if s.agent == s.goal:
            s.done = True
            return self._observe("Reached the goal.", reward=GOAL_REWARD)
        s.done = s.step_count >= MAX_STEPS
        text = f"Moved {action.move}." if inside else f"Bumped into the wall moving {action.move}."
        return self._observe(text + (" Out of moves." if s.done else ""), reward=STEP_REWARD)

    @property
    def state(self) -> GridState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="grid_env", description="Walk to the goal on a 4x4 grid", version="0.1.0"
        )

    def _observe(self, message: str, reward: float | None) -> GridObservation:
        s = self._state
        cells = {s.goal: "G", s.agent: "A"}
        board = "\n".join(
            " ".join(cells.get((r, c), ".") for c in range(SIZE)) for r in range(SIZE)
        )
        return GridObservation(
            board=board,
            message=message,
            steps_left=MAX_STEPS - s.step_count,
            reward=reward,
            done=s.done,
        )


app = create_app(
    GridEnvironment, GridAction, GridObservation, env_name="grid_env", max_concurrent_envs=64
)


def main() -> None:
    """Serve ``app`` with uvicorn on ``--host``/``--port``."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
