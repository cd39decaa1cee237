"""An OpenAI Agents SDK agent (``Agent`` + ``Runner``, function tools, the default Responses
API model) on the gateway: the model is ``OpenAIResponsesModel`` over the session's client,
and tracing is off for the run (the SDK would otherwise export traces to OpenAI)."""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded

from examples.gateway.calc_tools import calculator, multiply, prompt_of, score

__all__ = ["agent"]

TOOLS = [function_tool(calculator), function_tool(multiply)]


async def agent(row: dict[str, Any], llm: Any, max_turns: int = 4) -> float:
    """The row's messages (system prompt included) are the run's input; an agent that is
    still calling tools after ``max_turns`` model calls scores 0."""
    calc_agent = Agent(
        name="calculator",
        tools=TOOLS,
        model=OpenAIResponsesModel(model=llm.model, openai_client=llm.client),
    )
    try:
        result = await Runner.run(
            calc_agent,
            prompt_of(row),
            max_turns=max_turns,
            run_config=RunConfig(tracing_disabled=True),
        )
    except MaxTurnsExceeded:
        return 0.0
    return score(row, str(result.final_output))
