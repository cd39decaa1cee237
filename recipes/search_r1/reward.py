"""Search-R1 reward: exact match of the final ``<answer>`` (SQuAD normalisation, any of the
gold answers) with format terms for an answer that missed: 0.1 for a well-formed
``<answer>`` block, +0.1 when the sample searched successfully. Logs ``em`` and ``format``.
"""

from __future__ import annotations

import re
import string
from typing import Any

__all__ = ["compute_score", "final_answer", "normalize"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def final_answer(text: str) -> str | None:
    """The last ``<answer>`` block after the last tool response."""
    found = _ANSWER.findall(text.rsplit("</tool_response>", 1)[-1])
    return found[-1].strip() if found else None


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any]
) -> dict[str, float]:
    golds = ground_truth["target"] if isinstance(ground_truth, dict) else ground_truth
    golds = [golds] if isinstance(golds, str) else list(golds)
    answer = final_answer(solution_str)
    em = answer is not None and normalize(answer) in {normalize(g) for g in golds}
    searched = any(c["ok"] for c in extra_info["calls"])
    formatted = answer is not None
    score = 1.0 if em else 0.1 * formatted + 0.1 * (formatted and searched)
    return {"score": score, "em": float(em), "format": float(formatted)}
