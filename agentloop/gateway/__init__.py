"""The session gateway: agents written with the OpenAI SDK, the Agents SDK, LangChain,
smolagents or plain HTTP are trained unmodified through an OpenAI-compatible endpoint per
rollout session, on exactly the tokens the engine sampled (docs/gateway.md)."""

from agentloop.gateway.endpoint import AgentFailed, LLMEndpoint
from agentloop.gateway.loop import GatewayAgentLoop
from agentloop.gateway.messages import GatewayInputError
from agentloop.gateway.server import Gateway
from agentloop.gateway.session import ChatCall, Completion, Segment, Session, SessionLimitError

__all__ = [
    "AgentFailed",
    "ChatCall",
    "Completion",
    "Gateway",
    "GatewayAgentLoop",
    "GatewayInputError",
    "LLMEndpoint",
    "Segment",
    "Session",
    "SessionLimitError",
]
