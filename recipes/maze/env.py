"""The maze: a grid of walls (``#``) and floor (``.``) made by a seeded depth-first carve, a
start and an exit several moves apart, and what the agent sees from a cell: its position, the
four neighbours (open or wall) and where the exit lies relative to it. Distances by BFS."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

__all__ = ["MAX_MOVES", "MOVES", "WALL_REPLY", "Maze", "make_maze", "observe", "wall_reply"]

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

MAX_MOVES = 12
"""Moves a walk gets unless its row says otherwise (``max_moves``)."""

Cell = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Maze:
    grid: tuple[str, ...]
    """Rows of ``#`` (wall) and ``.`` (floor)."""
    start: Cell
    goal: Cell

    def open(self, cell: Cell) -> bool:
        r, c = cell
        return 0 <= r < len(self.grid) and 0 <= c < len(self.grid[0]) and self.grid[r][c] == "."

    def step(self, cell: Cell, move: str) -> Cell | None:
        """The cell ``move`` leads to from ``cell``; None into a wall."""
        dr, dc = MOVES[move]
        nxt = (cell[0] + dr, cell[1] + dc)
        return nxt if self.open(nxt) else None

    def distances(self) -> dict[Cell, int]:
        """BFS distance of every reachable cell to the exit."""
        dist = {self.goal: 0}
        queue = deque([self.goal])
        while queue:
            cell = queue.popleft()
            for move in MOVES:
                nxt = self.step(cell, move)
                if nxt is not None and nxt not in dist:
                    dist[nxt] = dist[cell] + 1
                    queue.append(nxt)
        return dist

    def shortest_path(self) -> list[str]:
        """The moves of a shortest path from the start to the exit."""
        dist, cell, path = self.distances(), self.start, []
        while cell != self.goal:
            move = next(m for m in MOVES if (n := self.step(cell, m)) and dist[n] < dist[cell])
            path.append(move)
            cell = self.step(cell, move)  # type: ignore[assignment]
        return path

    def to_json(self) -> dict:
        return {"grid": list(self.grid), "start": list(self.start), "goal": list(self.goal)}

    @classmethod
    def from_json(cls, data: dict) -> Maze:
        return cls(tuple(data["grid"]), tuple(data["start"]), tuple(data["goal"]))  # type: ignore[arg-type]


def make_maze(rng: random.Random, cells: int = 4, min_moves: int = 4, max_moves: int = 8) -> Maze:
    """A ``2 * cells + 1`` square grid carved from the top-left cell; the exit is a cell whose
    shortest path from the start takes ``min_moves``..``max_moves`` moves."""
    size = 2 * cells + 1
    while True:
        grid = [["#"] * size for _ in range(size)]
        stack = [(1, 1)]
        grid[1][1] = "."
        while stack:
            r, c = stack[-1]
            options = [
                (r + 2 * dr, c + 2 * dc, dr, dc)
                for dr, dc in MOVES.values()
                if 0 < r + 2 * dr < size
                and 0 < c + 2 * dc < size
                and grid[r + 2 * dr][c + 2 * dc] == "#"
            ]
            if not options:
                stack.pop()
                continue
            nr, nc, dr, dc = rng.choice(options)
            grid[r + dr][c + dc] = grid[nr][nc] = "."
            stack.append((nr, nc))
        start = (1, 1)
        rows = tuple("".join(row) for row in grid)
        reach = Maze(rows, start, start).distances()  # from the start (BFS is symmetric)
        far = sorted(cell for cell, d in reach.items() if min_moves <= d <= max_moves)
        if far:
            return Maze(rows, start, rng.choice(far))


def observe(maze: Maze, cell: Cell) -> str:
    """What the agent sees at ``cell``: no map, only its neighbours and the exit's offset."""
    around = ", ".join(f"{move}: {'open' if maze.step(cell, move) else 'wall'}" for move in MOVES)
    dr, dc = maze.goal[0] - cell[0], maze.goal[1] - cell[1]
    where = []
    if dr:
        where.append(f"{abs(dr)} {'down' if dr > 0 else 'up'}")
    if dc:
        where.append(f"{abs(dc)} {'right' if dc > 0 else 'left'}")
    return f"You are at row {cell[0]}, column {cell[1]}. {around}. The exit is {', '.join(where)}."


WALL_REPLY = "A wall blocks the way"
"""How a reply to a move into a wall begins (the tool's and the simulated user's)."""


def wall_reply(maze: Maze, cell: Cell, move: str) -> str:
    """The reply to ``move`` from ``cell`` into a wall: the walk stays and sees its cell again."""
    return f"{WALL_REPLY} {move}. {observe(maze, cell)}"
