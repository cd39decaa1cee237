"""``servers.shm``: what a server's child processes hold in ``/dev/shm`` (a real child maps a
real segment) and the removal of exactly those names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servers.shm import SHM, engine_shm, remove_shm

CHILD = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
segment = shared_memory.SharedMemory(create=True, size=4096)
resource_tracker.unregister(segment._name, "shared_memory")  # the test unlinks it
print(segment.name, flush=True)
sys.stdin.read()
"""


def test_a_childs_segment_is_listed_and_removed_and_others_are_not():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    name = "psm_unset"
    try:
        name = child.stdout.readline().strip()
        assert name.startswith("psm_") and (SHM / name).exists()
        assert name in engine_shm()  # this process's child maps it
        assert name not in engine_shm(child.pid)  # the child has no children
        assert remove_shm([name]) == [name]
        assert not (SHM / name).exists()
        assert remove_shm([name]) == []  # already gone: nothing to do
    finally:
        child.stdin.close()
        child.wait(timeout=30)
        (SHM / name).unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["../etc/passwd", "agentloop-stage-1.bin", "psm_x/y"])
def test_remove_shm_refuses_a_name_it_does_not_own(name):
    with pytest.raises(ValueError) as info:
        remove_shm([name])
    assert str(info.value) == f"{name!r} is not a /dev/shm segment or semaphore name"
