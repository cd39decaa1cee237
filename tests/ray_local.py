"""Local Ray for tests: two CPUs, no dashboard, and the repository on the workers' PYTHONPATH
(so tests can load helper loops and tools into Ray workers by dotted path)."""

from __future__ import annotations

import logging
from pathlib import Path

import ray

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]


def init_local_ray() -> None:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
    )


def init_ray_retrying(**kwargs) -> None:
    """``ray.init`` that tries once more when Ray's own head processes fail to start (seen on
    a loaded 2-core CI box: the GCS server died with "double free or corruption" and
    ``ray.init`` timed out waiting for its port file)."""
    try:
        ray.init(**kwargs)
    except RuntimeError as err:
        if "Timed out waiting for file" not in str(err):
            raise
        logger.warning("ray.init failed (%s); starting Ray once more", err)
        ray.shutdown()
        ray.init(**kwargs)
