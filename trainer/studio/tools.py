"""The tools of one config file, loaded as training loads them and called as an agent loop
calls them (``ToolRunner``: the same timeout, the same error text, the same truncation), so
what the page shows is what the model would read."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.config import MultiTurnConfig
from agentloop.parsers import ToolCall
from agentloop.tools import (
    BaseTool,
    ToolRunner,
    close_mcp_servers,
    load_tool_config,
    truncate_text,
)
from servers.user_code import load_module

__all__ = ["ToolBench", "ToolCallView", "ToolView", "load_tools"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ToolView:
    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON schema of the arguments (what the model is shown)."""
    source: str
    """Where it comes from: the file and the kind of entry (MCP server, class, function)."""


@dataclass(slots=True)
class ToolCallView:
    name: str
    arguments: dict[str, Any]
    text: str
    """The tool message as the model reads it (error text included, truncated as in training)."""
    ok: bool
    error_kind: str | None
    seconds: float
    truncated: bool


def load_tools(path: str | Path) -> dict[str, BaseTool]:
    """Every tool of ``path``: a tool YAML (native, verl, qwen-agent entries), an MCP JSON (its
    servers started) or a ``.py`` module whose module-level tools (``@function_tool``
    functions, ``BaseTool`` instances) are taken. Raises ValueError with the CLI's text."""
    file = Path(path).expanduser()
    if file.suffix == ".py":
        module = load_module(str(file), key="tool module", cache=False)  # edited between loads
        tools = {t.name: t for t in vars(module).values() if isinstance(t, BaseTool)}
        if not tools:
            raise ValueError(
                f"tool module {str(file)!r} defines no tool: decorate functions with "
                "@agentloop.tools.function_tool"
            )
        return tools
    return load_tool_config(file)


def _source(path: Path, tool: BaseTool) -> str:
    config = tool.config or {}
    if config.get("type") == "mcp":
        return f"{path.name}: MCP server {config.get('server')!r}"
    if path.suffix == ".py":
        return f"{path.name}: function {getattr(tool, 'fn', tool).__name__}"
    return f"{path.name}: {type(tool).__module__}.{type(tool).__name__}"


class ToolBench:
    """One loaded tool config; ``close`` stops what it started (MCP servers)."""

    def __init__(self, path: str | Path, multi_turn: MultiTurnConfig | None = None) -> None:
        self.path = Path(path).expanduser()
        self.multi_turn = multi_turn or MultiTurnConfig()
        self.tools = load_tools(self.path)
        self.runner = ToolRunner(self.tools, timeout_s=self.multi_turn.tool_timeout_s)

    def describe(self) -> list[ToolView]:
        out = []
        for name, tool in sorted(self.tools.items()):
            function = tool.tool_schema.get("function", {})
            out.append(
                ToolView(
                    name=name,
                    description=function.get("description", ""),
                    parameters=function.get("parameters", {}),
                    source=_source(self.path, tool),
                )
            )
        return out

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        create_kwargs: dict[str, Any] | None = None,
    ) -> ToolCallView:
        """One call in a fresh instance (created with ``create_kwargs``, released after)."""
        if name not in self.tools:
            raise ValueError(f"no tool named {name!r}; loaded: {', '.join(sorted(self.tools))}")
        tool = self.tools[name]
        instance = await tool.create(f"studio-{uuid.uuid4().hex[:8]}", **(create_kwargs or {}))
        start = time.perf_counter()
        try:
            call = ToolCall(name, arguments, raw=json.dumps(arguments))
            (outcome,) = await self.runner.run([call], {name: instance})
        finally:
            await tool.release(instance)
        limit = self.multi_turn.max_tool_response_length
        text = truncate_text(outcome.text, limit, self.multi_turn.tool_response_truncate_side)
        return ToolCallView(
            name=name,
            arguments=arguments,
            text=text,
            ok=outcome.ok,
            error_kind=outcome.error_kind,
            seconds=time.perf_counter() - start,
            truncated=text != outcome.text,
        )

    def close(self) -> None:
        close_mcp_servers(self.tools.values())
