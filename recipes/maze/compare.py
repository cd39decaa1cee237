"""Two runs' held-out mazes compared maze by maze: the validation dumps that
``trainer.validation_data_dir`` writes (``<dir>/<step>.jsonl``), paired by the row's ``index``.

A walk succeeded when it reached the exit: the move tool's reward of 1 (tool rows), or a rule
score of 1 on the simulated-user rows (their reward is the exit alone). The pairing and the
sign test are ``recipes.paired``'s.

Each dump's habits are printed first: its success rate, how many moves a walk made into a wall
(replies that begin with ``WALL_REPLY``), how many walks the length limit cut and how many
answered short of the exit. One dump alone prints its habits only; it may be a training dump
(``trainer.rollout_data_dir``, several walks a maze), which cannot be paired.

    python -m recipes.maze.compare A/8.jsonl B/8.jsonl
    python -m recipes.maze.compare A/0.jsonl
    python -m recipes.maze.compare rollouts/5.jsonl
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.maze.env import WALL_REPLY
from recipes.paired import by_row, compare_main, read_dump

__all__ = ["Habits", "habits", "load_walks", "main", "reached_exit"]


def reached_exit(record: dict[str, Any]) -> bool:
    """Whether a dumped maze walk reached the exit."""
    move = (record.get("tool_rewards") or {}).get("move")
    if move is not None:
        return float(move) >= 1.0
    rule = (record.get("scores") or {}).get("rule")
    if rule is None:
        raise ValueError(
            f"row index {record.get('index')}: neither a move-tool reward nor a rule score; "
            "compare the dumps of a maze run (trainer.validation_data_dir)"
        )
    return float(rule) >= 1.0


def load_walks(path: str | Path) -> dict[int, bool]:
    """Row index -> reached the exit, for one validation dump."""
    return {i: reached_exit(r) for i, r in by_row(read_dump(path), path).items()}


@dataclass(frozen=True, slots=True)
class Habits:
    """How one run's walks went."""

    walks: int
    exit_rate: float
    wall_moves: float
    """Moves into a wall per walk (the walk stays in its cell)."""
    cut: int
    """Walks the length limit ended (``stop_reason`` length)."""
    gave_up: int
    """Walks that answered short of the exit (ended without a tool call, not at the exit)."""

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.walks} walks, {100 * self.exit_rate:.1f}% at the exit, "
            f"{self.wall_moves:.2f} moves into a wall a walk, {self.cut} cut at the length "
            f"limit, {self.gave_up} answered short of the exit"
        )


def habits(walks: list[dict[str, Any]]) -> Habits:
    """Some walks' success rate, wall moves per walk, walks cut at the length limit and walks
    that answered short of the exit."""
    n = len(walks)
    if n == 0:
        raise ValueError("the dump holds no walks")
    exits = [reached_exit(r) for r in walks]
    stops = [r.get("stop_reason") for r in walks]
    return Habits(
        walks=n,
        exit_rate=sum(exits) / n,
        wall_moves=sum(str(r.get("response_text", "")).count(WALL_REPLY) for r in walks) / n,
        cut=stops.count("length"),
        gave_up=sum(
            1
            for stop, done in zip(stops, exits, strict=True)
            if stop == "no_tool_call" and not done
        ),
    )


def main(argv: list[str] | None = None) -> None:
    compare_main(
        argv,
        description=__doc__.split("\n\n")[0],
        habits=habits,
        solved=reached_exit,
        rows="mazes",
    )


if __name__ == "__main__":
    main()
