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
from typing import Any

from trainer.config.run import LOG_LEVELS

__all__ = ["LOG_LEVELS", "init_ray", "setup_worker_logging"]

logger = logging.getLogger("agentloop.train")

_ENV = "AGENTLOOP_WORKER_LOG_LEVEL"


def setup_worker_logging() -> None:
    """Ray's ``worker_process_setup_hook``: runs once in every worker process at start."""
    level = os.environ.get(_ENV, "WARNING")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)


def init_ray(
    worker_log_level: str = "WARNING",
    env: dict[str, str] | None = None,
    ray_init: dict[str, Any] | None = None,
) -> None:
    """Start Ray, or join a running cluster, with worker logs forwarded to this console at
    ``worker_log_level`` and ``env`` set in every worker; a no-op where Ray is already up
    (the caller's settings stand). ``ray_init``: ``ray_kwargs.ray_init`` (keyword arguments of
    ``ray.init``; None values are left out, a ``runtime_env`` is merged with this one). Which
    Ray is Ray's own rule: ``ray_init.address``, else ``RAY_ADDRESS``, else the cluster a
    ``ray start`` on this machine left running, else a new one here."""
    import ray

    if ray.is_initialized():
        return
    kwargs = {k: v for k, v in (ray_init or {}).items() if v is not None}
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {
        _ENV: worker_log_level,
        "VLLM_LOGGING_LEVEL": worker_log_level,
        **(env or {}),
        **(runtime_env.get("env_vars") or {}),
    }
    runtime_env.setdefault(
        "worker_process_setup_hook", "trainer.launch.worker_logs.setup_worker_logging"
    )
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", True)
    ray.init(runtime_env=runtime_env, **kwargs)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1:
        logger.info(
            "joined a Ray cluster of %d nodes at %s",
            len(nodes),
            ray.get_runtime_context().gcs_address,
        )
