"""Ray started so that what workers log reaches the driver's console.

Every Ray worker process (AsyncServers, agent-loop workers, trainer ranks, the judge's
servers) configures Python logging at ``trainer.worker_log_level`` before it runs anything,
and Ray forwards its stderr to the driver, prefixed with the actor and pid. That is where a
server restart, a tool that cannot start or a reward warning raised inside a worker shows up.
vLLM's own logger follows the same level (``VLLM_LOGGING_LEVEL``), so INFO shows the
engines' start-up logs and WARNING keeps the console to what needs attention.
"""

from __future__ import annotations

import logging
import os

from trainer.config.run import LOG_LEVELS

__all__ = ["LOG_LEVELS", "init_ray", "setup_worker_logging"]

_ENV = "AGENTLOOP_WORKER_LOG_LEVEL"


def setup_worker_logging() -> None:
    """Ray's ``worker_process_setup_hook``: runs once in every worker process at start."""
    level = os.environ.get(_ENV, "WARNING")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)


def init_ray(worker_log_level: str = "WARNING", env: dict[str, str] | None = None) -> None:
    """Start local Ray (no dashboard) with worker logs forwarded to this console at
    ``worker_log_level`` and ``env`` set in every worker; a no-op where Ray is already up
    (the caller's settings stand)."""
    import ray

    if ray.is_initialized():
        return
    ray.init(
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={
            "worker_process_setup_hook": "trainer.launch.worker_logs.setup_worker_logging",
            "env_vars": {
                _ENV: worker_log_level,
                "VLLM_LOGGING_LEVEL": worker_log_level,
                **(env or {}),
            },
        },
    )
