"""qwen-agent tools behind our interface: built-ins by registered name (e.g. ``storage``,
``code_interpreter`` where its extra dependencies are installed) and user subclasses of
``qwen_agent.tools.base.BaseTool``. Their ``call`` is synchronous, so it runs in a thread."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentloop.tools.base import BaseTool, ToolError, ToolResult

__all__ = ["QwenAgentTool", "qwen_agent_tool"]


def _parameters(tool: Any) -> dict[str, Any]:
    params = tool.parameters
    if isinstance(params, list):  # the older list-of-parameters style
        properties = {
            p["name"]: {"type": p.get("type", "string"), "description": p.get("description", "")}
            for p in params
        }
        required = [p["name"] for p in params if p.get("required")]
        return {"type": "object", "properties": properties, "required": required}
    return dict(params or {"type": "object", "properties": {}})


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(hasattr(v, "text") or isinstance(v, dict) for v in value):
        parts = [
            getattr(v, "text", None) or (v.get("text") if isinstance(v, dict) else None)
            for v in value
        ]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        raise ToolError(f"returned {type(value).__name__}, which has no text form") from None


class QwenAgentTool(BaseTool):
    """Wraps one qwen-agent tool instance."""

    def __init__(self, tool: Any) -> None:
        schema = {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": _parameters(tool),
            },
        }
        super().__init__({"type": "qwen_agent"}, schema)
        self.tool = tool

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        value = await asyncio.to_thread(self.tool.call, json.dumps(arguments, ensure_ascii=False))
        return ToolResult(_text(value))


def qwen_agent_tool(tool: str | type, cfg: dict[str, Any] | None = None) -> QwenAgentTool:
    """A registered qwen-agent tool by name, or a qwen-agent ``BaseTool`` subclass."""
    from qwen_agent.tools import TOOL_REGISTRY
    from qwen_agent.tools.base import BaseTool as QwenBaseTool

    if isinstance(tool, str):
        if tool not in TOOL_REGISTRY:
            known = ", ".join(sorted(TOOL_REGISTRY))
            raise ValueError(f"qwen-agent has no tool named {tool!r}; registered: {known}")
        tool = TOOL_REGISTRY[tool]
    if not (isinstance(tool, type) and issubclass(tool, QwenBaseTool)):
        raise ValueError(f"{tool!r} is not a qwen_agent.tools.base.BaseTool subclass")
    try:
        return QwenAgentTool(tool(cfg or {}))
    except ImportError as exc:
        raise ValueError(
            f"qwen-agent tool {tool.__name__} needs a package that is missing: {exc}"
        ) from exc
