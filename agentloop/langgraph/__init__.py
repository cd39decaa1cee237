"""LangGraph agents on the token API: a LangChain chat model whose every turn carries its
exact token trajectory, and ``react_agent`` (a ReAct graph over it).

Imported on first use (``agent_name: react_agent`` or ``import agentloop.langgraph``), so
workers without LangGraph rows never pay for the import.
"""

from agentloop.langgraph.chat_model import (
    AgentLoopChatModel,
    TrajectoryLimitError,
    trajectory_of,
    turn_limit,
)
from agentloop.langgraph.messages import METADATA_KEY, from_chat_dicts, to_chat_dicts
from agentloop.langgraph.react_agent import ReactAgentLoop, build_react_graph

__all__ = [
    "METADATA_KEY",
    "AgentLoopChatModel",
    "ReactAgentLoop",
    "TrajectoryLimitError",
    "build_react_graph",
    "from_chat_dicts",
    "to_chat_dicts",
    "trajectory_of",
    "turn_limit",
]
