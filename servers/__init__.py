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
    from servers.config import EngineConfig, ServerConfig
    from servers.core import ServerCore
    from servers.group import ServerGroup, ServerRestartError, launch_servers, stop_servers
    from servers.manager import AsyncLLMServerManager, NoHealthyServerError
    from servers.types import (
        EngineDeadError,
        GenerateInputError,
        GenerateRequest,
        SamplingParams,
        TokenOutput,
    )

# Each module and the names it gives ``servers``, as imported above for type checkers; the
# three lists (these imports, this table, ``__all__``) are held equal by
# tests/unit/test_init_name_lists.py.
_EXPORTS = {
    "servers.actor": ("AsyncServer",),
    "servers.config": ("EngineConfig", "ServerConfig"),
    "servers.core": ("ServerCore",),
    "servers.group": ("ServerGroup", "ServerRestartError", "launch_servers", "stop_servers"),
    "servers.manager": ("AsyncLLMServerManager", "NoHealthyServerError"),
    "servers.types": (
        "EngineDeadError",
        "GenerateInputError",
        "GenerateRequest",
        "SamplingParams",
        "TokenOutput",
    ),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "AsyncLLMServerManager",
    "AsyncServer",
    "EngineConfig",
    "EngineDeadError",
    "GenerateInputError",
    "GenerateRequest",
    "NoHealthyServerError",
    "ServerConfig",
    "ServerCore",
    "ServerGroup",
    "SamplingParams",
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
