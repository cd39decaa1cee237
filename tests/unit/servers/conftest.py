"""Fixtures of the server unit tests."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture()
def dead_pid() -> int:
    """The pid of a process that has ended (the owner of an orphaned file or folder)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
