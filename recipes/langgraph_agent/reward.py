"""Reward of the custom-operator task (``custom_reward_function.path``).

1.0 when the last ``<answer>N</answer>`` equals the ground truth; otherwise a small shaping
term: 0.1 for a well-formed answer, plus up to 0.2 for successful ``custom_op`` calls (capped
at the number of operators, so extra calls earn nothing).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["compute_score", "final_answer"]

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def final_answer(text: str) -> int | None:
    """The last ``<answer>`` integer after the last tool response (None if there is none)."""
    tail = text.rsplit("</tool_response>", 1)[-1]
    found = _ANSWER.findall(tail)
    return int(found[-1]) if found else None


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
) -> dict[str, float]:
    answer = final_answer(solution_str)
    correct = answer is not None and answer == int(ground_truth)
    ops = int(extra_info.get("ops", 1)) or 1
    calls = [c for c in extra_info["calls"] if c["name"] == "custom_op" and c["ok"]]
    tool_use = min(len(calls), ops) / ops
    score = 1.0 if correct else 0.1 * (answer is not None) + 0.2 * tool_use
    return {"score": score, "correct": float(correct), "tool_use": tool_use}
