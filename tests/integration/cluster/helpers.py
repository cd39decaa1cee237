"""What the cluster tests and the cluster benchmark share: a one-tool MCP environment that says
which node its server runs on, and a plain CPU trainer spec."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

NODE_SERVER = Path(__file__).with_name("node_mcp_server.py")


def write_node_tools(d: Path) -> tuple[Path, Path]:
    """``mcp.json`` (the ``where`` server, tool ``where-node``) and ``loops.yaml`` (the
    ``node_tool_agent`` loop, which calls it every turn) in ``d``."""
    mcp = d / "mcp.json"
    mcp.write_text(
        json.dumps(
            {"mcpServers": {"where": {"command": sys.executable, "args": [str(NODE_SERVER)]}}}
        )
    )
    loops = d / "loops.yaml"
    loop = {
        "name": "node_tool_agent",
        "_target_": "tests.integration.agentloop.helpers.NodeToolAgentLoop",
    }
    loops.write_text(yaml.safe_dump([loop]))
    return mcp, loops


def cpu_spec(path: Path | str):
    """A CPU trainer rank's spec for the model at ``path`` with the default actor settings."""
    from trainer.config.actor import ActorConfig, ModelConfig, RefConfig
    from trainer.workers import WorkerSpec

    return WorkerSpec(
        model_path=str(path),
        model=ModelConfig(path=str(path)),
        actor=ActorConfig(),
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
