"""Two runs' held-out repo_fix tasks compared task by task: the validation dumps that
``trainer.validation_data_dir`` writes (``<dir>/<step>.jsonl``), paired by the row's ``index``
(``recipes.paired``: the exact sign test and the paired standard error).

A task is solved when its check scored 1 (every test passes; the sample's ``score``). Each
dump's habits are printed first: its pass rate, tool calls a sample, edits that applied
(``str_replace`` / ``write_file`` calls that ran), samples that ran the check themselves
(``run_check``), samples that ended without an applied edit, samples the length limit cut, and
which file a sample read first: the module that defines the function the failing tests call
(where the bug is), another file, or none.
One dump alone prints its habits only; it may be a training dump (``trainer.rollout_data_dir``,
several samples a task), which cannot be paired.

    python -m recipes.repo_fix.compare A/8.jsonl B/0.jsonl
    python -m recipes.repo_fix.compare rollouts/5.jsonl
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from recipes.paired import compare_main

__all__ = ["EDIT_TOOLS", "Habits", "buggy_module", "first_read", "habits", "main", "solved"]

EDIT_TOOLS = ("str_replace", "write_file")
"""The workspace tools that change a file."""


_CALLED = re.compile(r"expects `(\w+)\(")
_LISTED = re.compile(r"^- (\S+\.py): (.+)$", re.M)


def buggy_module(problem: str) -> str | None:
    """The module that defines the function the first failing test calls, read from the
    problem's lines (``traces.problem_of``: "... expects `f(...)` ..." and "- path: f, g");
    None when the text has no such lines."""
    called = _CALLED.search(problem)
    if called is None:
        return None
    for listed in _LISTED.finditer(problem):
        if called.group(1) in listed.group(2).split(", "):
            return listed.group(1)
    return None


def first_read(record: dict[str, Any]) -> str:
    """Which file a dumped sample read first: ``buggy`` (the module ``buggy_module`` names),
    ``other``, ``none`` (no ``read_file`` call), or ``unknown`` (the dump has no problem
    text to name the module)."""
    reads = [c for c in record.get("calls") or [] if c["name"] == "read_file"]
    if not reads:
        return "none"
    module = buggy_module(record.get("prompt_text") or "")
    if module is None:
        return "unknown"
    path = str((reads[0].get("arguments") or {}).get("path", "")).removeprefix("./")
    return "buggy" if path == module else "other"


def solved(record: dict[str, Any]) -> bool:
    """Whether a dumped sample's check passed (its score is 1)."""
    score = record.get("score")
    if score is None:
        raise ValueError(
            f"row index {record.get('index')}: no score; compare the dumps of a repo_fix run "
            "(trainer.validation_data_dir)"
        )
    return float(score) >= 1.0


@dataclass(frozen=True, slots=True)
class Habits:
    """How one run's samples went."""

    samples: int
    pass_rate: float
    tool_calls: float
    """Tool calls a sample (those that ran or failed to start)."""
    edits: float
    """Edits that applied, a sample."""
    ran_check: int
    """Samples that called ``run_check`` at least once."""
    no_edit: int
    """Samples that ended without an applied edit."""
    cut: int
    """Samples the length limit ended (``stop_reason`` length)."""
    read_buggy: int = 0
    """Samples whose first ``read_file`` was the buggy module (``first_read``)."""
    read_other: int = 0
    """Samples whose first ``read_file`` was another file."""

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.samples} samples, {100 * self.pass_rate:.1f}% pass, "
            f"{self.tool_calls:.2f} tool calls and {self.edits:.2f} applied edits a sample, "
            f"{self.ran_check} ran the check, {self.no_edit} without an edit, {self.cut} cut at "
            f"the length limit, {self.read_buggy} read the buggy module first and "
            f"{self.read_other} another file"
        )


def habits(samples: list[dict[str, Any]]) -> Habits:
    """Some samples' pass rate, tool use, edits and length cuts."""
    n = len(samples)
    if n == 0:
        raise ValueError("the dump holds no samples")
    calls = [r.get("calls") or [] for r in samples]
    edits = [sum(1 for c in cs if c["name"] in EDIT_TOOLS and c["ok"]) for cs in calls]
    reads = [first_read(r) for r in samples]
    return Habits(
        samples=n,
        pass_rate=sum(solved(r) for r in samples) / n,
        tool_calls=sum(len(cs) for cs in calls) / n,
        edits=sum(edits) / n,
        ran_check=sum(1 for cs in calls if any(c["name"] == "run_check" for c in cs)),
        no_edit=edits.count(0),
        cut=sum(1 for r in samples if r.get("stop_reason") == "length"),
        read_buggy=reads.count("buggy"),
        read_other=reads.count("other"),
    )


def main(argv: list[str] | None = None) -> None:
    compare_main(
        argv,
        description=__doc__.split("\n\n")[0],
        habits=habits,
        solved=solved,
        rows="tasks",
    )


if __name__ == "__main__":
    main()
