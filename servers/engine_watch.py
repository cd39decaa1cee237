"""An engine process does not outlive its server.

A vLLM engine runs in a child process of the server that starts it (``EngineCore``; its own
workers, where it has them, watch the engine core through vLLM's death pipe). vLLM ends the
engine core at a clean shutdown, but nothing tells it when the server process is killed:
SIGKILL of a Ray actor, or a driver killed with its job. The orphan keeps its model in memory
and keeps polling: one measured here held 3.2 GB and 70-140% of a core for 35 minutes after its
server was gone, until the next run on the machine was killed for memory.

So a server names itself in ``AGENTLOOP_ENGINE_PARENT`` (its pid) before it starts an engine,
and a process whose parent is that pid watches it: a daemon thread checks every
``POLL_S`` whether the parent is still its parent; once it is not, the process sends itself
SIGTERM (vLLM's handler shuts the engine down and unlinks what it can), and SIGKILL after
``GRACE_S``. The watch starts in either way vLLM starts the engine core:

- spawned (vLLM's choice in a Ray actor, or with CUDA): ``register`` is a vLLM general plugin
  (entry point ``vllm.general_plugins``), which vLLM loads in every process it starts;
- forked: the server calls ``register`` itself before it starts the engine, which arms
  ``os.register_at_fork``, and a forked child checks the same condition.

Only direct children of the named server watch: the engine core's own children (its parent is
not the server) and every other process are left alone.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

__all__ = ["GRACE_S", "PARENT_ENV", "POLL_S", "name_parent", "register", "watch_parent"]

logger = logging.getLogger(__name__)

PARENT_ENV = "AGENTLOOP_ENGINE_PARENT"
"""The server's pid, set in its environment before it starts an engine."""
POLL_S = 1.0
"""Seconds between two checks of the parent."""
GRACE_S = 10.0
"""Seconds from SIGTERM to SIGKILL, for an engine whose shutdown hangs."""

_armed = False


def name_parent() -> None:
    """Called by a server before it starts an engine: its children watch this process."""
    os.environ[PARENT_ENV] = str(os.getpid())


def register() -> None:
    """The vLLM plugin: watch the parent where this process is a server's engine, and arm the
    same check for processes this one forks. Idempotent."""
    global _armed
    if _armed:
        return
    _armed = True
    _watch_if_engine()
    os.register_at_fork(after_in_child=_watch_if_engine)


def _watch_if_engine() -> None:
    if os.environ.get(PARENT_ENV) == str(os.getppid()):
        watch_parent()


def watch_parent(poll_s: float = POLL_S, grace_s: float = GRACE_S) -> threading.Thread:
    """Start the daemon thread that ends this process once its parent is gone."""
    thread = threading.Thread(
        target=_watch,
        args=(os.getppid(), poll_s, grace_s),
        name="agentloop-engine-watch",
        daemon=True,
    )
    thread.start()
    return thread


def _watch(parent: int, poll_s: float, grace_s: float) -> None:
    while os.getppid() == parent:  # an orphan is re-parented to init or a subreaper
        time.sleep(poll_s)
    logger.warning(
        "engine process %d: its server (pid %d) is gone; shutting down", os.getpid(), parent
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)
