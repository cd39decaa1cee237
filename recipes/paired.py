"""Two runs' held-out samples compared row by row: the validation dumps that
``trainer.validation_data_dir`` writes (``<dir>/<step>.jsonl``, one sample a row), paired by the
row's ``index``.

Where the two runs differ, an exact two-sided sign test (McNemar's) says how often a difference
this one-sided comes by chance; the paired standard error of the difference is
sqrt(discordant) / n. A recipe says what success is (``recipes.maze.compare``: the exit;
``recipes.repo_fix.compare``: every test passes) and what habits of a dump to print.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Paired", "by_row", "compare", "compare_main", "read_dump", "sign_test"]


def read_dump(path: str | Path) -> list[dict[str, Any]]:
    """Every sample of a dump: a validation dump, or a training one (``trainer.rollout_data_dir``,
    a group of samples a row)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def by_row(samples: list[dict[str, Any]], path: str | Path = "the dump") -> dict[int, dict]:
    """Row index -> its one sample; a row sampled twice is refused (nothing to pair it with)."""
    records: dict[int, dict[str, Any]] = {}
    for record in samples:
        index = int(record["index"])
        if index in records:
            raise ValueError(
                f"{path}: row index {index} appears more than once (a training dump, or "
                "rollout.val_kwargs.n > 1), so there is no one sample a row to pair; pass it "
                "alone for its habits"
            )
        records[index] = record
    return records


def sign_test(a_only: int, b_only: int) -> float:
    """Exact two-sided sign test of ``a_only`` against ``b_only`` discordant pairs."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True, slots=True)
class Paired:
    """Two runs' successes over the same rows."""

    n: int
    a_rate: float
    b_rate: float
    a_only: int
    """Rows A's sample solved and B's did not."""
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

    def line(self, rows: str) -> str:
        """One line: ``rows`` names what a row is, in the plural (``mazes``, ``tasks``)."""
        return (
            f"{self.n} {rows}: A {100 * self.a_rate:.1f}%, B {100 * self.b_rate:.1f}%, "
            f"A - B {self.diff_points:+.1f} points (paired SE {self.paired_se_points:.1f}); "
            f"A alone {self.a_only}, B alone {self.b_only}; sign test p = {self.p_value:.2g}"
        )


def compare(a: dict[int, bool], b: dict[int, bool]) -> Paired:
    """The paired comparison of two runs' successes (row index -> solved) over the same rows."""
    if set(a) != set(b):
        missing = sorted(set(a) ^ set(b))[:5]
        raise ValueError(
            f"the dumps hold different rows (e.g. index {missing}); compare validations of "
            "the same data.val_files"
        )
    n = len(a)
    if n == 0:
        raise ValueError("the dumps hold no samples")
    return Paired(
        n=n,
        a_rate=sum(a.values()) / n,
        b_rate=sum(b.values()) / n,
        a_only=sum(1 for i in a if a[i] and not b[i]),
        b_only=sum(1 for i in a if b[i] and not a[i]),
    )


class _Habits(Protocol):
    def line(self, name: str) -> str: ...


def compare_main(
    argv: list[str] | None,
    *,
    description: str,
    habits: Callable[[list[dict[str, Any]]], _Habits],
    solved: Callable[[dict[str, Any]], bool],
    rows: str,
) -> None:
    """A recipe's ``compare`` command: each dump's habits, then (given two) the paired
    comparison of ``solved`` over the same ``rows`` (plural, e.g. ``mazes``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("a", help="run A's validation dump (<dir>/<step>.jsonl)")
    parser.add_argument("b", nargs="?", help=f"run B's validation dump, of the same {rows}")
    args = parser.parse_args(argv)
    a = read_dump(args.a)
    print(habits(a).line("A"))
    if args.b is None:
        return
    b = read_dump(args.b)
    print(habits(b).line("B"))
    pairs = [
        {i: solved(r) for i, r in by_row(dump, path).items()}
        for dump, path in ((a, args.a), (b, args.b))
    ]
    print(compare(*pairs).line(rows))
