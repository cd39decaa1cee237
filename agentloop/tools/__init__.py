"""Tools agent loops call: the interface, the concurrent runner and config loading."""

from agentloop.tools.base import (
    BaseTool,
    ToolArgumentError,
    ToolError,
    ToolInfraError,
    ToolResult,
    normalize_schema,
)
from agentloop.tools.calculator import CalculatorTool
from agentloop.tools.config import load_tool_config
from agentloop.tools.function import FunctionTool, function_tool, schema_from_function
from agentloop.tools.mcp import MCPTool, close_mcp_servers, load_mcp_servers
from agentloop.tools.python_exec import PythonExecConfig, PythonExecTool, network_isolation
from agentloop.tools.qwen_tools import QwenAgentTool, qwen_agent_tool
from agentloop.tools.runner import CallOutcome, ToolRunner, truncate_text

__all__ = [
    "BaseTool",
    "CalculatorTool",
    "CallOutcome",
    "FunctionTool",
    "MCPTool",
    "PythonExecConfig",
    "PythonExecTool",
    "QwenAgentTool",
    "ToolArgumentError",
    "ToolError",
    "ToolInfraError",
    "ToolResult",
    "ToolRunner",
    "close_mcp_servers",
    "function_tool",
    "load_mcp_servers",
    "load_tool_config",
    "network_isolation",
    "normalize_schema",
    "qwen_agent_tool",
    "schema_from_function",
    "truncate_text",
]
