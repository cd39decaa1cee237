"""The Ray session and tiny-qwen3 server that test modules here share with the other
integration and reliability modules (``tests/ray_local.py``)."""

from tests.ray_local import (  # noqa: F401 - fixtures and hooks pytest finds by name
    _shared_ray_session,
    local_ray,
    pytest_collection_modifyitems,
    pytest_runtest_teardown,
    tiny_server,
)
