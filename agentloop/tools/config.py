"""Tool config files: an MCP JSON file ``{"mcpServers": {...}}`` (every server's tools), or
the verl YAML layout:

```yaml
tools:
  - class_name: my_pkg.tools.CalculatorTool   # a BaseTool subclass, or a class written
    config: {type: native}                     # against verl's tool API (verl_adapter.py);
                                               # config is passed to the constructor
    tool_schema: {type: function, function: {name: calc, description: ..., parameters: {...}}}
  - class_name: mcp                            # any name: MCP entries are read by type
    config: {type: mcp}
    mcp: {mcp_servers_config_path: servers.json, tool_selected_list: [search]}
  - class_name: qwen_agent                     # a qwen-agent tool: built-in by name ...
    config: {type: qwen_agent, name: storage, cfg: {storage_root_path: /tmp/kv}}
  - class_name: my_pkg.tools.MyQwenTool        # ... or a qwen_agent BaseTool subclass
    config: {type: qwen_agent}
  - class_name: workspace                      # the workspace tools (bash, read_file, ...;
    config: {type: workspace}                  # agentloop.workspace.tools)
```
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml

from agentloop.tools.base import BaseTool
from agentloop.tools.verl_adapter import VERL_API, missing_verl_api, verl_tool
from servers.user_code import UserCodeError, load_object

__all__ = ["load_tool_config"]


def load_tool_config(path: str | Path) -> dict[str, BaseTool]:
    """Instantiate every tool of a verl-layout YAML; returns name -> tool."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"multi_turn.tool_config_path {str(path)!r} does not exist")
    if path.suffix == ".json":
        from agentloop.tools.mcp import load_mcp_servers

        return load_mcp_servers(path)
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a top-level 'tools:' list")
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where} needs class_name")
        config = dict(entry.get("config") or {})
        kind = config.get("type", "native")
        if kind == "mcp":
            new = _mcp_entry(entry, path, where)
        elif kind == "qwen_agent":
            from agentloop.tools.qwen_tools import qwen_agent_tool

            name = config.get("name")
            target = name if name else load_object(entry["class_name"], key=f"{where}.class_name")
            tool = qwen_agent_tool(target, config.get("cfg"))
            new = {tool.name: tool}
        elif kind == "workspace":
            from agentloop.workspace.tools import workspace_tools

            try:
                new = dict(workspace_tools(config=config))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        elif kind == "native":
            tool = _native_entry(entry, config, where)
            new = {tool.name: tool}
        else:
            raise ValueError(
                f"{where}: config.type {kind!r} is not supported; use native, mcp, qwen_agent or "
                "workspace"
            )
        for name, tool in new.items():
            if name in tools:
                raise ValueError(f"{where}: a tool named {name!r} is already configured")
            tools[name] = tool
    return tools


def _native_entry(entry: dict[str, Any], config: dict[str, Any], where: str) -> BaseTool:
    """Our ``BaseTool`` subclass, or a class written against verl's tool API (wrapped)."""
    target = entry["class_name"]
    try:
        cls = load_object(target, key=f"{where}.class_name")
    except UserCodeError as exc:
        cause = exc.__cause__
        if isinstance(cause, ModuleNotFoundError) and importlib.util.find_spec("verl") is None:
            if (cause.name or "").split(".")[0] == "verl":
                raise UserCodeError(
                    f"{exc}; a class written against verl's tool API runs here as is once verl "
                    "is installed"
                ) from cause
        raise
    if isinstance(cls, type) and issubclass(cls, BaseTool):
        return cls(config=config, tool_schema=entry.get("tool_schema"))
    missing = missing_verl_api(cls)
    if missing:
        raise ValueError(
            f"{where}: {target} is not a BaseTool subclass and does not follow verl's tool API "
            f"(missing: {', '.join(missing)}); subclass agentloop.tools.BaseTool, or write "
            f"it against verl's API: {VERL_API}"
        )
    return verl_tool(cls, config, entry.get("tool_schema"), where)


def _mcp_entry(entry: dict[str, Any], path: Path, where: str) -> dict[str, BaseTool]:
    from agentloop.tools.mcp import load_mcp_servers

    mcp = entry.get("mcp") or {}
    servers = mcp.get("mcp_servers_config_path")
    if not servers:
        raise ValueError(f"{where}: an mcp entry needs mcp.mcp_servers_config_path")
    servers_path = Path(servers) if Path(servers).is_absolute() else path.parent / servers
    return load_mcp_servers(servers_path, mcp.get("tool_selected_list"))
