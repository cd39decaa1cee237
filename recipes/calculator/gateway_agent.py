"""The calculator task's agent written on the bare ``openai`` SDK, trained through the session
gateway (``DEMO_AGENT=gateway make demo``; docs/gateway.md).

It does what ``tool_agent`` does on this task, as a user would write it: the calculator tool's
schema, up to three model calls, each tool call answered with the calculator's result (or its
error). It returns no reward, so the run's reward function scores each sample as it scores
``tool_agent``'s.
"""

from __future__ import annotations

import json
from typing import Any

from agentloop.tools.base import ToolArgumentError
from agentloop.tools.calculator import CALCULATOR_SCHEMA, evaluate, format_value

__all__ = ["AGENT_YAML", "agent", "calculate"]

AGENT_YAML = """\
- name: calc_gateway
  _target_: agentloop.gateway.GatewayAgentLoop
  agent: recipes.calculator.gateway_agent:agent
"""
"""The agent-loop YAML entry naming this agent (``agent.agent_loop_config_path``)."""


def calculate(arguments: str) -> str:
    """The tool message of one calculator call."""
    try:
        expression = json.loads(arguments or "{}")["expression"]
        return format_value(evaluate(str(expression)))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        return f"Error: bad arguments for calculator: {err}"
    except ToolArgumentError as err:
        return f"Error: {err}"


async def agent(row: dict[str, Any], llm: Any, max_calls: int = 3) -> None:
    messages = [dict(m) for m in row["raw_prompt"]]
    for _ in range(max_calls):
        reply = await llm.client.chat.completions.create(
            model=llm.model, messages=messages, tools=[CALCULATOR_SCHEMA]
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return None
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            content = calculate(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return None
