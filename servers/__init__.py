"""Inference servers: token-level ``generate`` over vLLM or SGLang, as Ray actors with an
HTTP front, and the client-side ``AsyncLLMServerManager``. Knows nothing of agents or training.

The names below load on first use (PEP 562), so the torch-only modules the trainer imports
(``servers.weights``, ``servers.lora``, ``servers.shm``) come without Ray, FastAPI or vLLM:
the trainer's FSDP workers and their ``gpu`` tests run where only torch and transformers are.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servers.actor import AsyncServer
    from servers.config import ServerConfig
    from servers.core import ServerCore
    from servers.group import ServerGroup, ServerRestartError, launch_servers, stop_servers
    from servers.manager import AsyncLLMServerManager, NoHealthyServerError
    from servers.types import EngineDeadError, GenerateInputError, TokenOutput

_HOMES = {
    "AsyncLLMServerManager": "servers.manager",
    "AsyncServer": "servers.actor",
    "EngineDeadError": "servers.types",
    "GenerateInputError": "servers.types",
    "NoHealthyServerError": "servers.manager",
    "ServerConfig": "servers.config",
    "ServerCore": "servers.core",
    "ServerGroup": "servers.group",
    "ServerRestartError": "servers.group",
    "TokenOutput": "servers.types",
    "launch_servers": "servers.group",
    "stop_servers": "servers.group",
}

__all__ = [
    "AsyncLLMServerManager",
    "AsyncServer",
    "EngineDeadError",
    "GenerateInputError",
    "NoHealthyServerError",
    "ServerConfig",
    "ServerCore",
    "ServerGroup",
    "ServerRestartError",
    "TokenOutput",
    "launch_servers",
    "stop_servers",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'servers' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
