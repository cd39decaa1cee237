"""A Ray cluster of several nodes on this one machine (``tests/ray_cluster.py``)."""

from tests.ray_local import *  # noqa: F403 - fixtures and hooks pytest finds by name
