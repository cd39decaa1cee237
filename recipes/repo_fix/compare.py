"""Two runs' held-out repo_fix tasks compared task by task: the validation dumps that
``trainer.validation_data_dir`` writes (``<dir>/<step>.jsonl``), paired by the row's ``index``
(``recipes.paired``: the exact sign test and the paired standard error).

A task is solved when its check scored 1 (every test passes; the sample's ``score``). Each
dump's habits are printed first: its pass rate, tool calls a sample, edits that applied
(``str_replace`` / ``write_file`` calls that ran), samples that ran the check themselves
(``run_check``), samples that ended without an applied edit, and samples the length limit cut.
One dump alone prints its habits only; it may be a training dump (``trainer.rollout_data_dir``,
several samples a task), which cannot be paired.

    python -m recipes.repo_fix.compare A/8.jsonl B/0.jsonl
    python -m recipes.repo_fix.compare rollouts/5.jsonl
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.paired import compare_main

__all__ = ["EDIT_TOOLS", "Habits", "habits", "main", "solved"]

EDIT_TOOLS = ("str_replace", "write_file")
"""The workspace tools that change a file."""


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

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.samples} samples, {100 * self.pass_rate:.1f}% pass, "
            f"{self.tool_calls:.2f} tool calls and {self.edits:.2f} applied edits a sample, "
            f"{self.ran_check} ran the check, {self.no_edit} without an edit, {self.cut} cut at "
            "the length limit"
        )


def habits(samples: list[dict[str, Any]]) -> Habits:
    """Some samples' pass rate, tool use, edits and length cuts."""
    n = len(samples)
    if n == 0:
        raise ValueError("the dump holds no samples")
    calls = [r.get("calls") or [] for r in samples]
    edits = [sum(1 for c in cs if c["name"] in EDIT_TOOLS and c["ok"]) for cs in calls]
    return Habits(
        samples=n,
        pass_rate=sum(solved(r) for r in samples) / n,
        tool_calls=sum(len(cs) for cs in calls) / n,
        edits=sum(edits) / n,
        ran_check=sum(1 for cs in calls if any(c["name"] == "run_check" for c in cs)),
        no_edit=edits.count(0),
        cut=sum(1 for r in samples if r.get("stop_reason") == "length"),
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
