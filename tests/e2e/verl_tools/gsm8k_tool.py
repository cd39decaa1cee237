"""A GSM8K answer checker written against verl's tool API, not agentloop's: the kind of file a
verl user already has. agentloop loads it unchanged from ``gsm8k_tool_config.yaml`` (verl's
YAML layout) and wraps it (``agentloop/tools/verl_adapter.py``).

verl is not installed here, so ``ToolResponse`` is a minimal local stand-in for
``verl.tools.schemas.ToolResponse``; with verl installed a user would import that instead.
Rows carry ``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass
class ToolResponse:
    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


def score(answer: str, ground_truth: Any) -> float:
    """1.0 when the last number in ``answer`` equals the ground truth, else 0.0."""
    numbers = _NUMBER.findall(answer)
    if not numbers or ground_truth is None:
        return 0.0
    try:
        given = float(numbers[-1].replace(",", ""))
        truth = float(str(ground_truth).replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 if given == truth else 0.0


class Gsm8kTool:
    """``calc_gsm8k_reward(answer)``: scores a submitted answer against the row's ground truth.
    Each call's step reward is that answer's score; ``calc_reward`` is the last answer's."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name = self.tool_schema.function.name
        self._state: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> Any:
        return getattr(self, "tool_schema", None)

    async def create(
        self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        if ground_truth is None:  # verl's current agent loop passes create_kwargs=...
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._state[instance_id] = {"ground_truth": ground_truth, "score": 0.0, "submitted": 0}
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        state = self._state[instance_id]
        answer = str(parameters.get("answer", ""))
        state["score"] = score(answer, state["ground_truth"])
        state["submitted"] += 1
        text = f"Submitted answer {answer!r}: score {state['score']}"
        return ToolResponse(text=text), state["score"], {"submitted": state["submitted"]}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self._state[instance_id]["score"]

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        del self._state[instance_id]
