"""Local Ray for tests: two CPUs, no dashboard, and the repository on the workers' PYTHONPATH
(so tests can load helper loops and tools into Ray workers by dotted path)."""

from __future__ import annotations

from pathlib import Path

import ray

REPO = Path(__file__).resolve().parents[1]


def init_local_ray() -> None:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
    )
