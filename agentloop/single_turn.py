"""``single_turn_agent``: the prompt, one model turn, done."""

from __future__ import annotations

import uuid
from typing import Any

from agentloop.base import AgentLoopBase, AgentLoopOutput, register
from agentloop.records import SampleRecord
from agentloop.tokens import Trajectory

__all__ = ["SingleTurnAgentLoop"]


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    offers_tools = False

    async def run(
        self, sampling_params: dict[str, Any], *, raw_prompt: list[dict[str, Any]], **row: Any
    ) -> AgentLoopOutput:
        prompt_ids = await self.encode_prompt(raw_prompt)
        traj = Trajectory(prompt_ids, self.config.response_length)
        out = await self.generate(uuid.uuid4().hex, traj, sampling_params)
        return self.output(
            traj,
            num_turns=2,
            record=SampleRecord(finish_reasons=[out.finish_reason], stop_reason=out.finish_reason),
        )
