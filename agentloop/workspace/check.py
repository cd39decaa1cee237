"""The workspace reward: the task's check, run after the agent, becomes the sample's score.

All or nothing by default (exit code 0 scores 1, anything else 0). With ``partial: true`` the
score is the fraction of the task's ``tests`` (pytest node ids) that the output reports
``PASSED`` (``-v`` lines ``tests/x.py::t PASSED`` or ``-rA`` lines ``PASSED tests/x.py::t``), or
without ``tests`` the fraction pytest's summary line gives (passed / (passed + failed +
errors)). A check that timed out, was stopped at a limit or could not start scores 0 with the
reason in ``CheckResult.reason``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from agentloop.workspace.runner import CommandResult
from agentloop.workspace.task import WorkspaceTask

__all__ = ["CheckResult", "pytest_counts", "score_check"]

_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
_SUMMARY = re.compile(r"^.*\b\d+ (?:passed|failed|errors?)\b.* in [\d.]+s\b.*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome; ``as_reward()`` is the reward dict (``score`` + these fields)."""

    score: float
    passed: int
    failed: int
    timed_out: bool
    reason: str | None
    """Why it scored 0 without a verdict (timed out, stopped at a limit, sandbox error)."""
    check_s: float
    exit_code: int | None
    output_tail: str

    def as_reward(self) -> dict[str, Any]:
        """The verl-style reward dict: ``score`` and the other fields beside it."""
        return asdict(self)


def pytest_counts(output: str) -> dict[str, int]:
    """Counts from pytest's last summary line (``3 passed, 1 failed in 0.2s``); {} if none."""
    lines = _SUMMARY.findall(output)
    if not lines:
        return {}
    counts: dict[str, int] = {}
    for number, word in _COUNT.findall(lines[-1]):
        counts["errors" if word.startswith("error") else word] = int(number)
    return counts


def _named_outcomes(output: str, tests: tuple[str, ...]) -> tuple[int, int]:
    passed = 0
    for test in tests:
        name = re.escape(test)
        if re.search(rf"(^PASSED {name}\s*$)|(^{name} PASSED\b)", output, re.MULTILINE):
            passed += 1
    return passed, len(tests) - passed


def score_check(task: WorkspaceTask, result: CommandResult, tail_chars: int) -> CheckResult:
    """The reward of ``task`` given its check's ``result``."""
    text = result.output.decode("utf-8", "replace")
    tail = result.tail(tail_chars)
    counts = pytest_counts(text)
    passed = counts.get("passed", 0)
    failed = counts.get("failed", 0) + counts.get("errors", 0)
    reason = result.reason
    if reason is not None:
        return CheckResult(0.0, passed, failed, result.timed_out, f"check {reason}",
                           result.seconds, result.exit_code, tail)  # fmt: skip
    if task.partial and task.tests:
        passed, failed = _named_outcomes(text, task.tests)
        score = passed / len(task.tests)
    elif task.partial:
        score = passed / (passed + failed) if passed + failed else 0.0
        if not counts:
            reason = "partial credit: no pytest summary line in the check's output"
    else:
        score = 1.0 if result.exit_code == 0 else 0.0
    return CheckResult(score, passed, failed, False, reason, result.seconds, result.exit_code, tail)
