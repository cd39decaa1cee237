"""Shared memory in ``/dev/shm`` (RAM) that tests leave behind.

A process killed with SIGKILL cannot unlink its ``psm_*`` segments or ``sem.*`` semaphores.
``ServerGroup`` removes those of engines it kills; tests that kill other processes (trainer
ranks) remove the segments that appeared meanwhile (``remove_new_segments``). The session
fixture in ``tests/conftest.py`` checks with ``leaked`` that nothing was left. What a name is
and who maps it is read with ``servers.shm``'s functions.
"""

from __future__ import annotations

import time
from pathlib import Path

from servers.shm import SHM, mapped, owner_pid, remove_shm, shm_entries

__all__ = ["in_use", "leaked", "remove_new_segments", "shm_entries", "shm_segments"]


def _alive(pid: int | None) -> bool:
    return pid is not None and Path(f"/proc/{pid}").exists()


def shm_segments() -> set[Path]:
    return {SHM / name for name in shm_entries() if name.startswith("psm_")}


def remove_new_segments(before: set[Path]) -> None:
    """Unlink the ``psm_*`` segments that appeared since ``before`` and no live process maps
    (another test session's running engines keep theirs), and every semaphore named after a
    process that is gone (``sem.loky-<pid>-*``), or a folder of a server that is gone."""
    new = [segment.name for segment in shm_segments() - before]
    if new:
        mapped_now = in_use()
        new = [name for name in new if name not in mapped_now]
    creators = {name: owner_pid(name) for name in shm_entries()}
    orphans = [name for name, pid in creators.items() if pid is not None and not _alive(pid)]
    remove_shm(sorted({*new, *orphans}))


def in_use() -> set[str]:
    """``/dev/shm`` names a running process maps, or a semaphore named after a running
    process (``sem.loky-<pid>-*``: a semaphore's mapping does not show its name), or a
    folder of a running server (``agentloop-vllm-<pid>-*``)."""
    names = {name for name in shm_entries() if _alive(owner_pid(name))}
    for maps in Path("/proc").glob("[0-9]*/maps"):
        names |= mapped(int(maps.parent.name))
    return names


def leaked(before: set[str], wait_s: float = 10.0) -> list[str]:
    """Entries new since ``before`` that no live process uses. Processes a test stopped may
    still be exiting (and unlinking), so this waits up to ``wait_s`` for the list to empty."""
    deadline = time.monotonic() + wait_s
    while True:
        new = shm_entries() - before
        left = sorted(new - in_use()) if new else []
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)
