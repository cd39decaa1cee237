"""A gateway session loop over a scripted engine, for the gateway's unit tests."""

from __future__ import annotations

import json
from typing import Any

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.config import GatewayConfig
from agentloop.gateway import GatewayAgentLoop, Session
from agentloop.gateway.loop import gateway_of
from tests.unit.agentloop.scripted import ScriptedServer

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def hermes_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def make_loop(
    tokenizer: Any,
    turns: list[str],
    *,
    response_length: int = 512,
    agent: str = "tests.unit.agentloop.gateway.agents:weather_agent",
    command: str | list[str] | None = None,
    external: bool = False,
    **gateway: Any,
) -> tuple[GatewayAgentLoop, ScriptedServer]:
    """A loop running ``agent`` (or ``command``, or an ``external`` agent) on ``turns``."""
    server = ScriptedServer(tokenizer, turns, end_token="<|im_end|>")
    config = RolloutConfig(
        prompt_length=1024, response_length=response_length, gateway=GatewayConfig(**gateway)
    )
    kind = {"command": command} if command else {"external": True} if external else {}
    context = AgentLoopContext(server, tokenizer, config)
    CONTEXTS.append(context)
    return GatewayAgentLoop(context, **(kind or {"agent": agent})), server


CONTEXTS: list[AgentLoopContext] = []
"""The contexts ``make_loop`` made; ``stop_gateways`` stops their gateways."""


async def stop_gateways() -> None:
    """Stop the gateways the test started, on its own event loop (a gateway left listening
    after its loop has closed holds a socket nobody serves), and close what their loops
    shared (a coding CLI's workspace pool)."""
    while CONTEXTS:
        context = CONTEXTS.pop()
        await context.close_resources()
        if context.gateway is not None:
            await context.gateway.stop()


async def open_session(
    tokenizer: Any, turns: list[str], **gateway: Any
) -> tuple[Any, Session, ScriptedServer]:
    """A gateway listening with one open session over a scripted engine answering ``turns``:
    (gateway, session, server)."""
    loop, server = make_loop(tokenizer, turns, **gateway)
    gw = await gateway_of(loop.context)
    session = Session(loop)
    gw.open(session)
    return gw, session, server
