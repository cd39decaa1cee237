"""A reward file tried on one answer: loaded and checked as training loads and checks it
(the same error text), called as the reward manager calls it (verl's keywords)."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.rewards.rules import check_reward_function, describe_function, load_reward_function

__all__ = ["RewardBench", "RewardView"]

KEY = "custom_reward_function"


@dataclass(slots=True)
class RewardView:
    result: Any
    """What the function returned (a number or a dict with ``score``)."""
    score: float | None
    """The number training would use (None: the result has none)."""
    error: str | None
    """The exception the call raised, as ``Type: message``."""


class RewardBench:
    def __init__(self, path: str | Path, name: str = "compute_score") -> None:
        self.path, self.name = str(Path(path).expanduser()), name
        self.fn = load_reward_function(self.path, name, KEY)
        check_reward_function(
            self.fn, describe_function(self.path, name), name, {}, f"{KEY}.reward_kwargs"
        )

    def score(self, row: dict[str, Any], answer: str) -> RewardView:
        """``answer`` scored against ``row`` (its ``data_source``, ``reward_model.ground_truth``
        and ``extra_info``)."""
        kwargs = {
            "data_source": row.get("data_source", ""),
            "solution_str": answer,
            "ground_truth": (row.get("reward_model") or {}).get("ground_truth"),
            "extra_info": dict(row.get("extra_info") or {}),
        }
        try:
            result = self.fn(**kwargs)
            if inspect.isawaitable(result):
                import asyncio

                result = asyncio.run(result)
        except Exception as exc:  # noqa: BLE001 - the user's function; show what it raised
            return RewardView(None, None, f"{type(exc).__name__}: {exc}")
        value = result.get("score") if isinstance(result, dict) else result
        score = float(value) if isinstance(value, int | float) and math.isfinite(value) else None
        return RewardView(result, score, None)
