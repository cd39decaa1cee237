"""The maze's rule reward: 1 when the sample reached the exit (the ``move`` tool's
``calc_reward``, or the simulated user's final score), else 0. Per-step progress comes on top
as turn rewards: the tool's per-call rewards (``reward_model.process_reward_coef``) or the
user's turn scores.

``settle`` (``custom_reward_function.reward_kwargs.settle``, the tool's ``progress``): a walk
that ends short of the exit also gets ``settle`` x its last cell's distance to the exit. With the
per-move progress (``progress`` x the distance it gained) that is potential-based shaping: every
walk's progress then sums to ``settle`` x the start's distance, and only reaching the exit and
the walls set one walk of a maze above another (walls cost, so an early answer can pay more than
moving on: ``give_up``). The reward is then ``{"score": exit + settle term, "acc": exit}``, so
validation's core metric stays the exit rate. Tool rows only: the simulated user's rows name no
cells.

``give_up`` (``reward_kwargs.give_up``, the tool's ``invalid``): a walk that ends short of the
exit with moves left is charged ``give_up`` x those moves, as if each had hit a wall. Without
it a wall costs and an answer does not, so a walk that expects to bump more than it expects to
win scores best by answering at once; with it no answer pays more than moving on (a walk's
progress and score then make ``settle`` x the start's distance less ``give_up`` x its walls and
moves left). Tool rows only (the moves are the tool's).
"""

from __future__ import annotations

import ast
from typing import Any

from recipes.maze.env import MAX_MOVES, Maze

__all__ = ["compute_score"]


def _last_cell(extra_info: dict[str, Any], maze: Maze) -> tuple[int, int]:
    """The cell the walk ended in: the state the last move call named (``(r, c)``), else the
    start."""
    for call in reversed(extra_info.get("calls") or []):
        key = call.get("state_key")
        if call.get("name") == "move" and _is_cell(key):
            return tuple(ast.literal_eval(key))  # type: ignore[return-value]
    return maze.start


def _moves_made(extra_info: dict[str, Any]) -> int:
    """Move calls that used a move (each names the cell it left the walk in)."""
    calls = extra_info.get("calls") or []
    return sum(1 for c in calls if c.get("name") == "move" and _is_cell(c.get("state_key")))


def _is_cell(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("(")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any],
    settle: float = 0.0,
    give_up: float = 0.0,
) -> float | dict[str, float]:
    reached = extra_info.get("tool_rewards", {}).get("move")
    if reached is None:
        reached = (extra_info.get("interaction") or {}).get("final_score")
    exit_ = 1.0 if reached and float(reached) >= 1.0 else 0.0
    if not settle and not give_up:
        return exit_
    spec = ((extra_info.get("tools_kwargs") or {}).get("move") or {}).get("create_kwargs")
    if not spec:
        key = "settle" if settle else "give_up"
        raise ValueError(
            f"custom_reward_function.reward_kwargs.{key} needs the move-tool rows "
            f"(extra_info.tools_kwargs.move); the simulated-user rows name no cells: drop {key}"
        )
    maze = Maze.from_json(spec["maze"])
    term = 0.0
    if not exit_:
        term += settle * maze.distances()[_last_cell(extra_info, maze)]
        left = int(spec.get("max_moves", MAX_MOVES)) - _moves_made(extra_info)
        term -= give_up * max(left, 0)
    return {"score": exit_ + term, "acc": exit_}
