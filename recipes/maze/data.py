"""The maze task as rows: ``tool_agent`` rows whose moves are ``move`` tool calls, rows where the
maze is a simulated user (``interaction``), and solved tool conversations (a shortest path) for
an SFT warm start. Train and validation mazes come from different seeds.

python -m recipes.maze.data --out data/maze --train 256 --val 64 --sft 256
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from recipes.maze.env import MAX_MOVES, Maze, make_maze, observe
from recipes.maze.tools import MOVE_SCHEMA

__all__ = ["SYSTEM", "SYSTEM_TALK", "main", "make_mazes", "make_rows", "make_sft_rows", "maze_key"]

DATA_SOURCE = "maze"
SYSTEM = (
    "You are in a maze and can only see the cells next to you. Call move with a direction "
    "(up, down, left or right) once per turn until you reach the exit, then say 'Done.'"
)
SYSTEM_TALK = (
    "You are in a maze and can only see the cells next to you. Answer each message with one "
    "direction to move: up, down, left or right."
)


def _maze_rows(maze: Maze, i: int, split: str, talk: bool) -> dict[str, Any]:
    first = observe(maze, maze.start)
    spec = {"maze": maze.to_json(), "max_moves": MAX_MOVES}
    extra: dict[str, Any] = {"split": split, "index": i, "shortest": len(maze.shortest_path())}
    if talk:
        extra["interaction_kwargs"] = {"name": "maze", **spec}
    else:
        extra["tools_kwargs"] = {"move": {"create_kwargs": spec}}
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM_TALK if talk else SYSTEM},
            {"role": "user", "content": first},
        ],
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "reward_model": {"style": "rule", "ground_truth": "exit"},
        "extra_info": extra,
    }


def maze_key(maze: Maze) -> str:
    return json.dumps(maze.to_json(), sort_keys=True)


def make_mazes(n: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[Maze]:
    """``n`` distinct seeded mazes, none of them in ``exclude`` (``maze_key``s)."""
    rng, out, seen = random.Random(seed), [], set(exclude)
    while len(out) < n:
        maze = make_maze(rng)
        if maze_key(maze) not in seen:
            seen.add(maze_key(maze))
            out.append(maze)
    return out


def make_rows(
    n: int, seed: int, split: str, talk: bool = False, exclude: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """``n`` mazes, none in ``exclude``; ``talk``: the maze answers as a simulated user
    instead of a tool."""
    return [_maze_rows(m, i, split, talk) for i, m in enumerate(make_mazes(n, seed, exclude))]


def make_sft_rows(n: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Solved conversations on mazes outside ``exclude``: a shortest path, one ``move`` call a
    turn, the tool's replies as the tool gives them, then 'Done.'"""
    rows = []
    for maze in make_mazes(n, seed, exclude):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": observe(maze, maze.start)},
        ]
        cell, left = maze.start, MAX_MOVES
        for move in maze.shortest_path():
            call = {"name": "move", "arguments": {"direction": move}}
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": call}],
                }
            )
            cell, left = maze.step(cell, move), left - 1  # type: ignore[assignment]
            reply = "You reached the exit!" if cell == maze.goal else observe(maze, cell)
            if cell != maze.goal:
                reply += f" Moves left: {left}."
            messages.append({"role": "tool", "content": reply})
        messages.append({"role": "assistant", "content": "Done."})
        rows.append({"messages": messages, "tools": [MOVE_SCHEMA]})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_task(out: Path, train: int, val: int, sft: int, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    seen = frozenset(maze_key(m) for m in make_mazes(train, seed))  # validation never sees them
    write_jsonl(out / "train.jsonl", make_rows(train, seed, "train"))
    write_jsonl(out / "val.jsonl", make_rows(val, seed + 1, "val", exclude=seen))
    write_jsonl(out / "train_talk.jsonl", make_rows(train, seed, "train", talk=True))
    write_jsonl(out / "val_talk.jsonl", make_rows(val, seed + 1, "val", talk=True, exclude=seen))
    write_jsonl(out / "sft.jsonl", make_sft_rows(sft, seed + 2, exclude=seen))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=64)
    parser.add_argument("--sft", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_task(args.out, args.train, args.val, args.sft, args.seed)
    print(f"wrote {args.train} train, {args.val} val, {args.sft} sft rows to {args.out}")


if __name__ == "__main__":
    main()
