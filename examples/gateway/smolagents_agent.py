"""A smolagents ``ToolCallingAgent`` over its ``OpenAIModel`` (``OpenAIServerModel`` is the
same class) on the session's endpoint. smolagents is synchronous, so the run goes to a
thread: the gateway serves it from this event loop meanwhile.

smolagents writes its history itself (a tool call comes back as assistant text "Calling
tools: ...", its result as a user "Observation: ..." message), so each of its calls extends
no earlier one and the gateway makes each call its own segment."""

from __future__ import annotations

import asyncio
from typing import Any

from smolagents import OpenAIModel, ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from examples.gateway.calc_tools import calculator, multiply, score, task_of

__all__ = ["agent"]

TOOLS = [tool(calculator), tool(multiply)]


def _run(row: dict[str, Any], llm: Any, max_steps: int) -> Any:
    model = OpenAIModel(
        model_id=llm.model,
        api_base=llm.base_url,
        api_key=llm.api_key,
        client_kwargs={"max_retries": 0},
    )
    system, task = task_of(row)
    smol = ToolCallingAgent(
        tools=TOOLS,
        model=model,
        max_steps=max_steps,
        instructions=system or None,
        verbosity_level=LogLevel.OFF,
    )
    return smol.run(task)


async def agent(row: dict[str, Any], llm: Any, max_steps: int = 4) -> float:
    """The answer is what the model passed to smolagents' ``final_answer`` tool (the bare
    number, or a ``#### N`` line)."""
    answer = str(await asyncio.to_thread(_run, row, llm, max_steps))
    return score(row, answer if "####" in answer else f"#### {answer.strip()}")
