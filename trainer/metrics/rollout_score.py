"""Accuracy and valid-tool-call rate of scored trajectories: the table ``agentloop-rollout``
prints after a run and the calculator demo's evaluation.

- accuracy: the share of samples whose reward is at least ``correct_at`` (1.0: a correct
  answer under a 0/1 reward such as the built-in scorers or the calculator's);
- valid tool-call rate: the share of samples that made at least one tool call and whose
  every call parsed and ran (``tool_errors == 0``);
- reward mean: the mean of the configured (weighted) reward.

Accuracy and reward mean are over the scored samples; a sample written unscored (``score``
None: nothing scores its data_source) counts in ``samples`` and ``unscored`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RolloutSummary", "format_summary", "summarize", "valid_tool_calls"]


@dataclass(frozen=True, slots=True)
class RolloutSummary:
    samples: int
    accuracy: float
    """Share of samples with ``score >= correct_at``."""
    valid_tool_calls: float
    """Share of samples with at least one tool call and no tool error."""
    reward_mean: float
    correct_at: float = 1.0
    unscored: int = 0
    """Samples written without a score."""


def valid_tool_calls(record: Mapping[str, Any]) -> bool:
    """The sample made at least one tool call and every call parsed and ran."""
    return record["tool_calls"] >= 1 and record["tool_errors"] == 0


def summarize(records: Sequence[Mapping[str, Any]], correct_at: float = 1.0) -> RolloutSummary:
    """The summary of trajectory records that carry ``score``, ``tool_calls``, ``tool_errors``
    (the JSON lines ``agentloop-rollout`` writes)."""
    n = max(len(records), 1)
    scores = [r["score"] for r in records if r["score"] is not None]
    m = max(len(scores), 1)
    return RolloutSummary(
        samples=len(records),
        accuracy=sum(s >= correct_at for s in scores) / m,
        valid_tool_calls=sum(valid_tool_calls(r) for r in records) / n,
        reward_mean=sum(scores) / m,
        correct_at=correct_at,
        unscored=len(records) - len(scores),
    )


def format_summary(summary: RolloutSummary) -> str:
    """A markdown table of one row, e.g.::

    | samples | accuracy (reward >= 1) | valid tool-call rate | reward mean |
    |---------|------------------------|----------------------|-------------|
    |       6 |                  33.3% |                50.0% |      0.3333 |

    With unscored samples an ``unscored`` column follows; accuracy and reward mean are then
    over the scored ones (``-`` when none is).
    """
    columns = ("samples", f"accuracy (reward >= {summary.correct_at:g})")
    columns += ("valid tool-call rate", "reward mean")
    none_scored = 0 < summary.unscored == summary.samples
    values = (
        str(summary.samples),
        "-" if none_scored else f"{summary.accuracy:.1%}",
        f"{summary.valid_tool_calls:.1%}",
        "-" if none_scored else f"{summary.reward_mean:.4f}",
    )
    if summary.unscored:
        columns += ("unscored",)
        values += (str(summary.unscored),)
    header = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("-" * (len(c) + 2) for c in columns) + "|"
    row = "| " + " | ".join(v.rjust(len(c)) for v, c in zip(values, columns, strict=True)) + " |"
    return f"{header}\n{rule}\n{row}\n"
