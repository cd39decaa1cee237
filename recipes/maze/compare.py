"""Two runs' held-out mazes compared maze by maze: the validation dumps that
``trainer.validation_data_dir`` writes (``<dir>/<step>.jsonl``), paired by the row's ``index``.

A walk succeeded when it reached the exit: the move tool's reward of 1 (tool rows), or a rule
score of 1 on the simulated-user rows (their reward is the exit alone). Where the two runs
differ, an exact two-sided sign test (McNemar's) says how often a difference this one-sided
comes by chance; the paired standard error of the difference is sqrt(discordant) / n.

Each dump's habits are printed first: its success rate, how many moves a walk made into a wall
(replies that begin with ``WALL_REPLY``), how many walks the length limit cut and how many
answered short of the exit. One dump alone prints its habits only; it may be a training dump
(``trainer.rollout_data_dir``, several walks a maze), which cannot be paired.

    python -m recipes.maze.compare A/8.jsonl B/8.jsonl
    python -m recipes.maze.compare A/0.jsonl
    python -m recipes.maze.compare rollouts/5.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.maze.env import WALL_REPLY

__all__ = [
    "Habits",
    "Paired",
    "by_maze",
    "compare",
    "habits",
    "load_dump",
    "load_walks",
    "reached_exit",
    "read_walks",
    "sign_test",
]


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


def read_walks(path: str | Path) -> list[dict[str, Any]]:
    """Every walk of a dump: a validation dump, or a training one (``trainer.rollout_data_dir``,
    a group of walks a maze)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def by_maze(walks: list[dict[str, Any]], path: str | Path = "the dump") -> dict[int, dict]:
    """Row index -> its one walk; a maze walked twice is refused (nothing to pair it with)."""
    records: dict[int, dict[str, Any]] = {}
    for record in walks:
        index = int(record["index"])
        if index in records:
            raise ValueError(
                f"{path}: row index {index} was walked more than once (a training dump, or "
                "rollout.val_kwargs.n > 1), so there is no one walk a maze to pair; pass it "
                "alone for its habits"
            )
        records[index] = record
    return records


def load_dump(path: str | Path) -> dict[int, dict[str, Any]]:
    """Row index -> its dumped walk, for one validation dump of one walk a maze."""
    return by_maze(read_walks(path), path)


def load_walks(path: str | Path) -> dict[int, bool]:
    """Row index -> reached the exit, for one validation dump."""
    return _exits(load_dump(path))


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


def sign_test(a_only: int, b_only: int) -> float:
    """Exact two-sided sign test of ``a_only`` against ``b_only`` discordant pairs."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True, slots=True)
class Paired:
    n: int
    a_rate: float
    b_rate: float
    a_only: int
    """Mazes A's walk solved and B's did not."""
    b_only: int

    @property
    def diff_points(self) -> float:
        return 100.0 * (self.a_rate - self.b_rate)

    @property
    def paired_se_points(self) -> float:
        return 100.0 * math.sqrt(self.a_only + self.b_only) / self.n

    @property
    def p_value(self) -> float:
        return sign_test(self.a_only, self.b_only)


def compare(a: dict[int, bool], b: dict[int, bool]) -> Paired:
    """The paired comparison of two runs' walks over the same mazes."""
    if set(a) != set(b):
        missing = sorted(set(a) ^ set(b))[:5]
        raise ValueError(
            f"the dumps hold different mazes (e.g. index {missing}); compare validations of "
            "the same data.val_files"
        )
    n = len(a)
    if n == 0:
        raise ValueError("the dumps hold no walks")
    return Paired(
        n=n,
        a_rate=sum(a.values()) / n,
        b_rate=sum(b.values()) / n,
        a_only=sum(1 for i in a if a[i] and not b[i]),
        b_only=sum(1 for i in a if b[i] and not a[i]),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="run A's validation dump (<dir>/<step>.jsonl)")
    parser.add_argument("b", nargs="?", help="run B's validation dump, of the same mazes")
    args = parser.parse_args(argv)
    a = read_walks(args.a)
    print(habits(a).line("A"))
    if args.b is None:
        return
    b = read_walks(args.b)
    print(habits(b).line("B"))
    r = compare(_exits(by_maze(a, args.a)), _exits(by_maze(b, args.b)))
    print(
        f"{r.n} mazes: A {100 * r.a_rate:.1f}%, B {100 * r.b_rate:.1f}%, "
        f"A - B {r.diff_points:+.1f} points (paired SE {r.paired_se_points:.1f}); "
        f"A alone {r.a_only}, B alone {r.b_only}; sign test p = {r.p_value:.2g}"
    )


def _exits(records: dict[int, dict[str, Any]]) -> dict[int, bool]:
    return {i: reached_exit(r) for i, r in records.items()}


if __name__ == "__main__":
    main()
