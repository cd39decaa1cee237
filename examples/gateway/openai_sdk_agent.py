"""A function-calling loop on the bare ``openai`` SDK: what most hand-written agents look
like. The gateway hands it ``llm.client`` (an ``AsyncOpenAI`` on the session's endpoint); the
same function runs unchanged against any OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

from examples.gateway.calc_tools import TOOLS, prompt_of, run_tool, score

__all__ = ["agent"]


async def agent(row: dict[str, Any], llm: Any, max_turns: int = 4) -> float:
    """Call tools until the model answers without one (or ``max_turns`` calls); the reward is
    the score of the last answer."""
    messages = prompt_of(row)
    answer = ""
    for _ in range(max_turns):
        reply = await llm.client.chat.completions.create(
            model=llm.model, messages=messages, tools=TOOLS
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return score(row, answer)
