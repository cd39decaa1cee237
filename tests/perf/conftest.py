"""Fixtures the benchmarks share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance for the module (``tests.ray_local``), shut down after it."""
    import ray

    from tests.ray_local import init_local_ray

    init_local_ray()
    yield
    ray.shutdown()
