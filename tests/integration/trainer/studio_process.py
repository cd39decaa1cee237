"""``agentloop-studio`` as the tests start it: the console script's module in a child
process, waited for until its first page answers."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_until_up(process: subprocess.Popen, url: str, timeout_s: float = 60) -> None:
    """Return once ``url/`` answers; fail if the studio exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(f"{url}/", timeout=2).raise_for_status()
            return
        except httpx.HTTPError:
            assert process.poll() is None, f"the studio exited ({process.returncode})"
            assert time.monotonic() < deadline, f"the studio did not answer in {timeout_s} s"
            time.sleep(0.3)
