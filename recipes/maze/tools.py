"""``move``: one step in the sample's maze (``tools_kwargs.move.create_kwargs.maze``).

The reply is what the agent sees from its new cell and how many moves it has left. Each call's
reward is progress: +``progress`` for a step closer to the exit, -``progress`` for one away,
-``invalid`` for a move into a wall (the agent stays). ``calc_reward`` is 1 when the exit was
reached. The call names its state, the cell (``ToolResult.state_key``), so GiGPO groups the
turns taken from one cell even though the replies differ in the moves left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentloop.tools import BaseTool, ToolError, ToolResult
from recipes.maze.env import MAX_MOVES, MOVES, Maze, observe, wall_reply

__all__ = ["MOVE_SCHEMA", "MoveTool"]

MOVE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Take one step in the maze.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": list(MOVES)}},
            "required": ["direction"],
        },
    },
}


@dataclass(slots=True)
class _Walk:
    maze: Maze
    cell: tuple[int, int]
    moves_left: int
    distance: dict[tuple[int, int], int]

    @property
    def solved(self) -> bool:
        return self.cell == self.maze.goal


class MoveTool(BaseTool):
    schema = MOVE_SCHEMA

    def __init__(self, config: dict[str, Any] | None = None, tool_schema=None) -> None:
        super().__init__(config, tool_schema or MOVE_SCHEMA)
        self.progress = float(self.config.get("progress", 0.1))
        self.invalid = float(self.config.get("invalid", 0.1))
        self._walks: dict[str, _Walk] = {}

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id)
        if "maze" not in create_kwargs:
            raise ToolError("move needs tools_kwargs.move.create_kwargs.maze in the row")
        maze = Maze.from_json(create_kwargs["maze"])
        moves = int(create_kwargs.get("max_moves", MAX_MOVES))
        self._walks[instance_id] = _Walk(maze, maze.start, moves, maze.distances())
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        walk = self._walks[instance_id]
        direction = arguments.get("direction")
        if direction not in MOVES:
            raise ToolError(f"direction must be one of {', '.join(MOVES)}, got {direction!r}")
        if walk.solved:
            return ToolResult("You are already at the exit.", state_key="exit")
        if walk.moves_left <= 0:
            return ToolResult("You have no moves left.", state_key="no-moves")
        walk.moves_left -= 1
        nxt = walk.maze.step(walk.cell, direction)
        if nxt is None:
            text = wall_reply(walk.maze, walk.cell, direction)
            reward = -self.invalid
        else:
            before, walk.cell = walk.distance[walk.cell], nxt
            reward = self.progress * (before - walk.distance[nxt])
            text = "You reached the exit!" if walk.solved else observe(walk.maze, nxt)
        if not walk.solved:
            text += f" Moves left: {walk.moves_left}."
        return ToolResult(text, reward=reward, state_key="exit" if walk.solved else f"{walk.cell}")

    async def calc_reward(self, instance_id: str) -> float:
        return 1.0 if self._walks[instance_id].solved else 0.0

    async def release(self, instance_id: str) -> None:
        self._walks.pop(instance_id, None)
