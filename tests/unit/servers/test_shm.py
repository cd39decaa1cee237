"""``servers.shm``: what a server's child processes hold in ``/dev/shm`` (a real child maps a
real segment) and the removal of exactly those names; ``tests.shm``, built on it, tells a
segment a live process maps from one left behind (the session's leak check)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servers.shm import SHM, engine_shm, mapped, remove_shm, semaphore_pid, shm_entries
from tests.shm import leaked, remove_new_segments, shm_segments

CHILD = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
segment = shared_memory.SharedMemory(create=True, size=4096)
resource_tracker.unregister(segment._name, "shared_memory")  # the test unlinks it
print(segment.name, flush=True)
sys.stdin.read()
"""


def start_child() -> tuple[subprocess.Popen, str]:
    """A child that maps a new segment until its stdin closes; the segment's name."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return child, child.stdout.readline().strip()


def test_a_childs_segment_is_listed_and_removed_and_others_are_not():
    child, name = start_child()
    try:
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


def test_a_segment_is_in_use_while_its_process_maps_it_and_leaked_once_it_exits():
    before, before_segments = shm_entries(), shm_segments()
    child, name = start_child()
    try:
        assert name in shm_entries() and name in mapped(child.pid)
        assert name not in mapped(os.getpid())
        assert name not in leaked(before, wait_s=0)  # mapped by a live process
        child.stdin.close()
        child.wait(timeout=30)
        assert mapped(child.pid) == set()  # gone: nothing to read
        assert name in leaked(before, wait_s=0)
        remove_new_segments(before_segments)
        assert not (SHM / name).exists()
    finally:
        if child.poll() is None:
            child.stdin.close()
            child.wait(timeout=30)
        (SHM / name).unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("sem.loky-4242-x1_y", 4242),
        ("sem.mp-17-abc", 17),
        ("sem.mp_lock", None),
        ("psm_4242", None),
    ],
)
def test_semaphore_pid_is_the_pid_a_semaphore_is_named_after(name, pid):
    assert semaphore_pid(name) == pid
