"""Test doubles for agent-loop unit tests: a scripted generate client and simple tools."""

from __future__ import annotations

import asyncio
from typing import Any

from agentloop.tools import BaseTool, ToolError, ToolResult
from servers.types import GenerateRequest, TokenOutput


class ScriptedServer:
    """Returns the scripted turns in order as token ids (+ end-of-turn), with log-probs
    -0.01 * (position + 1) so alignment is checkable. Records every request."""

    def __init__(
        self,
        tokenizer: Any,
        turns: list[str],
        *,
        end_turn: bool = True,
        end_token: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.end_turn = end_turn
        self.eot = tokenizer.convert_tokens_to_ids(end_token or tokenizer.eos_token)
        self.requests: list[dict[str, Any]] = []
        self.sampled: list[list[int]] = []
        self.priorities: list[int] = []

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        self.priorities.append(request.priority)
        sampling_params = request.sampling_params.to_dict()
        self.requests.append(
            {
                "session_id": request.session_id,
                "prompt_ids": list(request.prompt_ids),
                **sampling_params,
            }
        )
        text = self.turns.pop(0) if self.turns else "done"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.end_turn:
            ids.append(self.eot)
        finish = "stop"
        if len(ids) > sampling_params["max_tokens"]:
            ids, finish = ids[: sampling_params["max_tokens"]], "length"
        self.sampled.append(ids)
        return TokenOutput(ids, [-0.01 * (i + 1) for i in range(len(ids))], finish)


CALC_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class CalcTool(BaseTool):
    schema = CALC_SCHEMA

    def __init__(self, config=None, tool_schema=None) -> None:
        super().__init__(config, tool_schema)
        self.created: dict[str, dict[str, Any]] = {}
        self.released: list[str] = []

    async def create(self, instance_id=None, **create_kwargs):
        self.created[instance_id] = create_kwargs
        return instance_id

    async def execute(self, instance_id, arguments):
        if arguments["b"] == 0:
            raise ToolError("b must not be 0")
        offset = self.created[instance_id].get("offset", 0)
        return ToolResult(str(arguments["a"] + arguments["b"] + offset), reward=0.5)

    async def calc_reward(self, instance_id):
        return 1.0

    async def release(self, instance_id):
        self.released.append(instance_id)


def simple_schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


class SleepTool(BaseTool):
    """Sleeps ``arguments["s"]`` seconds (default 0.2) and answers ``slept``."""

    schema = simple_schema("sleep")

    async def execute(self, instance_id, arguments):
        await asyncio.sleep(arguments.get("s", 0.2))
        return ToolResult("slept")


class BrokenTool(BaseTool):
    """Raises a plain exception, or returns non-text with ``{"mode": "bytes"}``."""

    schema = simple_schema("broken")

    async def execute(self, instance_id, arguments):
        if arguments.get("mode") == "bytes":
            return ToolResult(b"raw")  # type: ignore[arg-type]
        raise RuntimeError("disk on fire")


class LongTool(BaseTool):
    schema = simple_schema("long")

    async def execute(self, instance_id, arguments):
        return ToolResult("A" * 50 + "B" * 50)
