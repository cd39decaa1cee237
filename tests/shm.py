"""Shared memory in ``/dev/shm`` (RAM) that tests leave behind.

A process killed with SIGKILL cannot unlink its ``psm_*`` segments or ``sem.*`` semaphores.
``ServerGroup`` removes those of engines it kills; tests that kill other processes (trainer
ranks) remove the segments that appeared meanwhile (``remove_new_segments``). The session
fixture in ``tests/conftest.py`` checks with ``leaked`` that nothing was left.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

SHM = Path("/dev/shm")
_KINDS = ("psm_", "sem.")
_SEM_PID = re.compile(r"sem\.[A-Za-z]+-(\d+)-")


def shm_segments() -> set[Path]:
    return set(SHM.glob("psm_*")) if SHM.is_dir() else set()


def remove_new_segments(before: set[Path]) -> None:
    """Unlink the ``psm_*`` segments that appeared since ``before``, and every semaphore named
    after a process that is gone (``sem.loky-<pid>-*``)."""
    for segment in shm_segments() - before:
        segment.unlink(missing_ok=True)
    for name in shm_entries():
        match = _SEM_PID.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            (SHM / name).unlink(missing_ok=True)


def shm_entries() -> set[str]:
    """Names of the ``psm_*`` segments and ``sem.*`` semaphores in ``/dev/shm`` now."""
    if not SHM.is_dir():
        return set()
    return {p.name for p in SHM.iterdir() if p.name.startswith(_KINDS)}


def in_use() -> set[str]:
    """``/dev/shm`` names a running process maps, or a semaphore named after a running
    process (``sem.loky-<pid>-*``: a semaphore's mapping does not show its name)."""
    names: set[str] = set()
    for entry in shm_entries():
        match = _SEM_PID.match(entry)
        if match and Path(f"/proc/{match.group(1)}").exists():
            names.add(entry)
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or not ours to read
            continue
        for line in text.splitlines():
            _, sep, name = line.partition(f" {SHM}/")
            if sep and not name.endswith(" (deleted)"):
                names.add(name)
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
