"""Whether a process id names a live process (for folders and files stamped with the pid of
the process that made them: staged weights, workspace run folders, semaphores)."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (or is a zombie not yet reaped), also when it belongs to
    another user (signal 0 is then refused, but the process exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
