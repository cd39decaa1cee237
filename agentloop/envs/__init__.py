"""Environments written in other projects' APIs, trained unchanged (docs/environments.md):
Prime Intellect ``verifiers`` environments (run in their own interpreter against the session
gateway) and OpenEnv environment servers (reset/step over their WebSocket protocol).

Both loops are imported on first use (``agent_name: verifiers``, or a YAML entry's
``_target_``): neither costs an import to a run that does not use it.
"""

from agentloop.envs.openenv_loop import OpenEnvAgentLoop
from agentloop.envs.verifiers_loop import VerifiersAgentLoop

__all__ = ["OpenEnvAgentLoop", "VerifiersAgentLoop"]
