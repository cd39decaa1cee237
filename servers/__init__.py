"""Inference servers: token-level ``generate`` over vLLM or SGLang, as Ray actors with an
HTTP front, and the client-side ``AsyncLLMServerManager``. Knows nothing of agents or training.
"""

from servers.actor import AsyncServer
from servers.config import ServerConfig
from servers.core import ServerCore
from servers.group import ServerGroup, ServerRestartError, launch_servers, stop_servers
from servers.manager import AsyncLLMServerManager, NoHealthyServerError
from servers.types import EngineDeadError, GenerateInputError, TokenOutput

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
