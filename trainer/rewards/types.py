"""What every reward sees of a sample, and the contract of what a reward returns."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = ["RewardComponent", "RewardFunctionError", "RewardSample", "as_score"]


class RewardFunctionError(ValueError):
    """A reward function broke its contract (returned NaN or a non-number); names it."""


@dataclass(slots=True)
class RewardSample:
    index: int
    data_source: str
    solution_str: str
    """The response as text (model and tool turns, special tokens dropped)."""
    ground_truth: Any
    extra_info: dict[str, Any]
    """The row's ``extra_info`` plus ``tool_rewards``, ``tool_calls``, ``num_turns``,
    ``calls`` (each tool call as the dict of its ``ToolCallRecord`` fields), ``stop_reason``,
    ``assistant_turns``, ``interaction`` (the simulated user's ``InteractionRecord`` as a dict:
    ``turn_scores``, ``final_score``, ``terminated``, ...; None without one) and
    ``turn_scores`` (the user's, verl's name) (built by ``trainer.rewards.manager.reward_info``)."""
    row: dict[str, Any] = field(repr=False)

    @property
    def question(self) -> str:
        """The last user message of the prompt."""
        messages = self.row.get("raw_prompt") or self.row.get("prompt") or []
        if isinstance(messages, str):
            return messages
        users = [m.get("content", "") for m in messages if m.get("role") == "user"]
        return str(users[-1]) if users else ""


class RewardComponent(Protocol):
    """One named reward. ``score`` returns, per sample, a number, a dict with ``score`` (its
    other numeric keys are logged), or the exception that sample's call raised."""

    name: str
    describe: str
    """What to name in an error about its results (e.g. ``reward.py:compute_score``)."""

    async def score(self, samples: list[RewardSample]) -> list[Any]: ...

    def metrics(self) -> dict[str, float]:
        """Counters of the last ``score`` call (logged as ``reward/<name>/<key>``)."""
        ...

    def close(self) -> None: ...


def as_score(value: Any, describe: str, sample: RewardSample) -> tuple[float, dict[str, float]]:
    """``(score, extra numeric keys)`` of one result; NaN, inf or a non-number raise
    ``RewardFunctionError`` naming the function and the sample."""
    extras: dict[str, float] = {}
    result = value
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardFunctionError(
                f"{describe} returned a dict without 'score' (keys: {sorted(value)}) for sample "
                f"{sample.index} (data_source={sample.data_source!r}); add a numeric 'score'"
            )
        extras = {
            k: float(v)
            for k, v in value.items()
            if k != "score" and isinstance(v, (numbers.Real, np.bool_))
        }
        result = value["score"]
    if isinstance(result, (numbers.Real, np.bool_)):
        score = float(result)
        if math.isfinite(score):
            return score, extras
    raise RewardFunctionError(
        f"{describe} returned {result!r} ({type(result).__name__}) for sample {sample.index} "
        f"(data_source={sample.data_source!r}); it must return a finite number or a dict with a "
        "numeric 'score'"
    )
