"""Worker logs reach the driver's console: a real Ray actor started by ``init_ray`` logs a
warning and an info line; the driver's output carries the warning (prefixed with the actor)
and, at ``WARNING``, not the info line; at ``INFO`` both. Each run is a fresh driver process."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.ray_local import REPO

pytestmark = pytest.mark.integration

DRIVER = """
import logging, sys, time
import ray
from trainer.launch.worker_logs import init_ray

init_ray(sys.argv[1])

@ray.remote(num_cpus=0)
class Probe:
    def log(self):
        log = logging.getLogger("servers.group")
        log.warning("probe warning: server 0 restarted")
        log.info("probe info: nothing to see")
        return True

assert ray.get(Probe.remote().log.remote())
time.sleep(3)  # Ray forwards worker output asynchronously
ray.shutdown()
"""


@pytest.mark.parametrize("level", ["WARNING", "INFO"])
def test_worker_logs_reach_the_driver_console_at_the_set_level(level):
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, level],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # Ray colours prefixes
    lines = [line for line in console.splitlines() if "probe " in line]
    assert any(
        line.startswith("(Probe pid=")
        and line.endswith("WARNING servers.group: probe warning: server 0 restarted")
        for line in lines
    ), console[-3000:]
    shows_info = any(
        line.endswith("INFO servers.group: probe info: nothing to see") for line in lines
    )
    assert shows_info is (level == "INFO"), lines
