"""Reward of the calculator task: 1.0 when the last ``#### N`` line after the last tool
response equals the ground truth, else 0.0 (accuracy is the mean reward)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["compute_score", "final_answer"]

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def final_answer(text: str) -> str | None:
    tail = text.rsplit("</tool_response>", 1)[-1]
    found = _FINAL.findall(tail)
    return found[-1].replace(",", "") if found else None


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
) -> float:
    return float(final_answer(solution_str) == str(ground_truth))
