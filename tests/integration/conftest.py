"""The Ray session and tiny-qwen3 server this folder's modules share with the other integration
and reliability modules (``tests/ray_local.py``)."""

from tests.ray_local import *  # noqa: F403 - fixtures and hooks pytest finds by name
