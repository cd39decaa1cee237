"""The maze as a simulated user (``multi_turn.interaction_config_path``): the model answers each
observation with a direction (``up``, ``down``, ``left`` or ``right``, the last one it writes),
the user replies with the next observation and scores the turn by its progress, and ends the
episode at the exit or when the moves run out. The replies carry no move counter, so equal
cells read equal text: GiGPO's default anchor keys (a hash of the reply) group them."""

from __future__ import annotations

import re
from typing import Any

from agentloop.interactions import Interaction
from recipes.maze.env import MOVES, Maze, observe, wall_reply

__all__ = ["MazeUser", "direction_of"]

_WORD = re.compile(r"\b(" + "|".join(MOVES) + r")\b", re.I)


def direction_of(text: str) -> str | None:
    """The last direction word in ``text`` (None: none)."""
    found = _WORD.findall(text or "")
    return found[-1].lower() if found else None


class MazeUser(Interaction):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.progress = float(config.get("progress", 0.1))
        self.invalid = float(config.get("invalid", 0.1))
        self._state: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id=None, maze=None, max_moves=12, **kwargs):
        if maze is None:
            raise ValueError("the maze user needs extra_info.interaction_kwargs.maze in the row")
        m = Maze.from_json(maze)
        self._state[instance_id] = {
            "maze": m, "cell": m.start, "left": int(max_moves), "dist": m.distances(),
        }  # fmt: skip
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        state = self._state[instance_id]
        maze, cell = state["maze"], state["cell"]
        move = direction_of(messages[-1].get("content") or "")
        if move is None:
            return False, f"Answer with one direction. {observe(maze, cell)}", -self.invalid, {}
        state["left"] -= 1
        nxt = maze.step(cell, move)
        if nxt is None:
            score, text = -self.invalid, wall_reply(maze, cell, move)
        else:
            score = self.progress * (state["dist"][cell] - state["dist"][nxt])
            state["cell"] = nxt
            text = "You reached the exit!" if nxt == maze.goal else observe(maze, nxt)
        done = state["cell"] == maze.goal or state["left"] <= 0
        return done, text, score, {}

    async def calculate_score(self, instance_id, **kwargs):
        state = self._state.get(instance_id)
        return 1.0 if state and state["cell"] == state["maze"].goal else 0.0

    async def finalize_interaction(self, instance_id, **kwargs):
        self._state.pop(instance_id, None)
