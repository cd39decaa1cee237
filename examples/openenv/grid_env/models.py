"""Action, observation and state of the grid environment (pydantic models on OpenEnv's bases)."""

from typing import Literal

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

Move = Literal["up", "down", "left", "right"]


class GridAction(Action):
    """One move of the agent; any other value fails the action schema (a validation error)."""

    move: Move = Field(..., description="Direction to move: up, down, left or right")


class GridObservation(Observation):
    """What the agent sees: the rendered board and a line of feedback.

    ``reward`` and ``done`` are the base class's fields; the server sends them beside the other
    fields, not inside them.
    """

    board: str = Field(default="", description="The grid, one row a line: A agent, G goal")
    message: str = Field(default="", description="What happened on the last step")
    steps_left: int = Field(default=0, ge=0, description="Moves left before the episode ends")


class GridState(State):
    """Server-side state: positions as (row, col), row 0 at the top."""

    agent: tuple[int, int] = (0, 0)
    goal: tuple[int, int] = (0, 0)
    done: bool = False
