"""The maze's rule reward: 1 when the sample reached the exit (the ``move`` tool's
``calc_reward``, or the simulated user's final score), else 0. Per-step progress comes on top
as turn rewards: the tool's per-call rewards (``reward_model.process_reward_coef``) or the
user's turn scores.

``settle`` (``custom_reward_function.reward_kwargs.settle``, the tool's ``progress``): a walk
that ends short of the exit also gets ``settle`` x its last cell's distance to the exit. With the
per-move progress (``progress`` x the distance it gained) that is potential-based shaping: every
walk's progress then sums to ``settle`` x the start's distance, so stopping early pays no more
than moving on, and only reaching the exit (and walls) set one walk of a maze above another. The
reward is then ``{"score": exit + settle term, "acc": exit}``, so validation's core metric stays
the exit rate. Tool rows only: the simulated user's rows name no cells.
"""

from __future__ import annotations

import ast
from typing import Any

from recipes.maze.env import Maze

__all__ = ["compute_score"]


def _last_cell(extra_info: dict[str, Any], maze: Maze) -> tuple[int, int]:
    """The cell the walk ended in: the state the last move call named (``(r, c)``), else the
    start."""
    for call in reversed(extra_info.get("calls") or []):
        key = call.get("state_key")
        if call.get("name") == "move" and key and key.startswith("("):
            return tuple(ast.literal_eval(key))  # type: ignore[return-value]
    return maze.start


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any],
    settle: float = 0.0,
) -> float | dict[str, float]:
    reached = extra_info.get("tool_rewards", {}).get("move")
    if reached is None:
        reached = (extra_info.get("interaction") or {}).get("final_score")
    exit_ = 1.0 if reached and float(reached) >= 1.0 else 0.0
    if not settle:
        return exit_
    spec = ((extra_info.get("tools_kwargs") or {}).get("move") or {}).get("create_kwargs")
    if not spec:
        raise ValueError(
            "custom_reward_function.reward_kwargs.settle needs the move-tool rows "
            "(extra_info.tools_kwargs.move); the simulated-user rows name no cells: drop settle"
        )
    maze = Maze.from_json(spec["maze"])
    term = 0.0 if exit_ else settle * maze.distances()[_last_cell(extra_info, maze)]
    return {"score": exit_ + term, "acc": exit_}
