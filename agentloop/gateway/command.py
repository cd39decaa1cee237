"""A gateway agent run as a command, one process per sample.

The process gets its session in the environment the ``openai`` SDK reads
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``) and the ``anthropic`` SDK and Claude Code read
(``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``), plus ``OPENAI_MODEL``, ``AGENTLOOP_SESSION_ID``,
``AGENTLOOP_ROW`` (the row as a JSON file), ``AGENTLOOP_REWARD_URL`` (POST
``{"reward": x}`` there) and ``AGENTLOOP_STATE_URL`` (POST ``{"state_key": "..."}`` there
before a chat call to name the state it acts on, for GiGPO). Its stdout and stderr are kept
beside the row in the session's log folder. A non-zero exit, or a run past
``gateway.agent_timeout_s`` (the process group is killed), fails the sample.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.gateway.endpoint import AgentFailed, LLMEndpoint
from agentloop.tools.mcp_errors import RUN_DIR_ENV

if TYPE_CHECKING:
    from agentloop.config import GatewayConfig

__all__ = ["run_command", "session_log_dir"]


def session_log_dir(config: GatewayConfig, session_id: str) -> Path:
    """The session's log folder (``gateway.log_dir`` or the run folder's ``gateway/``)."""
    run_dir = os.environ.get(RUN_DIR_ENV)  # set by agentloop-train: the run folder
    default = Path(run_dir) / "gateway" if run_dir else Path(tempfile.gettempdir()) / "gateway"
    root = Path(config.log_dir) if config.log_dir else default
    folder = root / session_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def run_command(
    command: str | list[str],
    llm: LLMEndpoint,
    row: dict[str, Any],
    config: GatewayConfig,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> Path:
    """Run ``command`` for one session; returns its log folder. Raises ``AgentFailed`` on a
    non-zero exit (with the tail of stderr); the caller's timeout cancels it, which kills
    the whole process group."""
    folder = session_log_dir(config, llm.session_id)
    row_file = folder / "row.json"
    row_file.write_text(json.dumps(row, default=str))
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    child_env = {
        **os.environ,
        **(env or {}),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": llm.api_key,
        "OPENAI_MODEL": llm.model,
        "ANTHROPIC_BASE_URL": llm.anthropic_base_url,
        "ANTHROPIC_API_KEY": llm.api_key,
        "AGENTLOOP_SESSION_ID": llm.session_id,
        "AGENTLOOP_ROW": str(row_file),
        "AGENTLOOP_REWARD_URL": llm.base_url.rsplit("/v1", 1)[0] + "/reward",
        "AGENTLOOP_STATE_URL": llm.base_url.rsplit("/v1", 1)[0] + "/state",
    }
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=err, env=child_env, cwd=cwd, start_new_session=True
        )
        try:
            code = await proc.wait()
        except asyncio.CancelledError:  # the time limit: the agent and its children go
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
            raise
    if code != 0:
        tail = (folder / "stderr.txt").read_text(errors="replace")[-2000:]
        raise AgentFailed(f"the agent command {argv[0]!r} exited with {code}; stderr:\n{tail}")
    return folder
