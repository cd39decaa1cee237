"""Agent loops over token-level servers: exact trajectories, tool-call parsing, tools, and
the workers/manager that turn dataset rows into padded training batches.

Never imports ``trainer``; talks to servers only through ``generate(GenerateRequest)``
(``servers.types``: prompt ids, typed ``SamplingParams``, the sample's ``session_id``).
"""

from agentloop import single_turn as _single_turn  # noqa: F401  (registers single_turn_agent)
from agentloop import tool_agent as _tool_agent  # noqa: F401  (registers tool_agent)
from agentloop.base import (
    AgentLoopBase,
    AgentLoopContext,
    AgentLoopOutput,
    get_agent_loop,
    load_agent_loop_config,
    register,
    registered_agent_loops,
)
from agentloop.batch import RolloutBatch, collate, rollout_metrics
from agentloop.config import AgentConfig, MultiTurnConfig, RolloutConfig, from_dict
from agentloop.formats import (
    ChatFormat,
    detect_format,
    get_format,
    register_format,
    register_parser,
    registered_formats,
)
from agentloop.manager import AgentLoopManager
from agentloop.parsers import ToolCall, ToolCallError
from agentloop.records import SampleRecord, ToolCallRecord
from agentloop.single_turn import SingleTurnAgentLoop
from agentloop.stream import FinishedGroup, RolloutStream
from agentloop.tokenizer import TokenizerSource, load_tokenizer
from agentloop.tokens import TemplateDeltaError, Trajectory, encode_delta, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from agentloop.trace import TraceContext
from agentloop.worker import AgentLoopWorker, toolless_rows, validate_rows

__all__ = [
    "AgentConfig",
    "AgentLoopBase",
    "AgentLoopContext",
    "AgentLoopManager",
    "TraceContext",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "FinishedGroup",
    "RolloutStream",
    "MultiTurnConfig",
    "RolloutBatch",
    "RolloutConfig",
    "SampleRecord",
    "SingleTurnAgentLoop",
    "TemplateDeltaError",
    "TokenizerSource",
    "ToolAgentLoop",
    "ToolCall",
    "ToolCallError",
    "ToolCallRecord",
    "Trajectory",
    "collate",
    "encode_delta",
    "from_dict",
    "get_agent_loop",
    "load_agent_loop_config",
    "load_tokenizer",
    "mask_spans",
    "register",
    "register_parser",
    "ChatFormat",
    "detect_format",
    "get_format",
    "register_format",
    "registered_formats",
    "registered_agent_loops",
    "rollout_metrics",
    "toolless_rows",
    "validate_rows",
]
