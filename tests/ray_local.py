"""Local Ray for tests: two CPUs, no dashboard, and the repository on the workers' PYTHONPATH
(so tests can load helper loops and tools into Ray workers by dotted path).

The integration and reliability modules share one such Ray session and one tiny-qwen3
``AsyncServer`` instead of each starting its own (Ray ~6-15 s, an engine 35-60 s on the 2-core
CI box). A module asks for the ``local_ray`` or ``tiny_server`` fixture (their conftests import
them from here); each is started by the first module that needs it and stopped right after
the last test that uses it (``pytest_runtest_teardown``). ``pytest_collection_modifyitems``
runs the modules that use Ray one after another, those that share the server among them, so
that an idle engine or Ray never sits beside the modules that do not use them. A module that
needs a Ray of its own calls ``stop_local_ray`` first and shuts its own down at its end."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# What a conftest star-imports: the fixtures and hooks pytest finds by name (the plain helpers
# are imported by name where used).
__all__ = [
    "_shared_ray_session",
    "local_ray",
    "pytest_collection_modifyitems",
    "pytest_runtest_teardown",
    "tiny_server",
]

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]

LOCAL_RAY: dict[str, Any] = {
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "runtime_env": {"env_vars": {"PYTHONPATH": str(REPO)}},
}

# The shared server's engine and HTTP front: settings that differ from vLLM's CPU defaults
# (2048 tokens, chunked prefill on, 20 log-probs) so that test_vllm_server can show they reach
# the engine, and small HTTP work limits that its tests cross. Modules that only generate
# (test_langgraph_agents) stay within them.
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 8  # small enough that requests wait, so the priority order shows
MAX_N, MAX_TOKENS, MAX_PROMPT, MAX_SEQUENCES = 4, 256, 300, 4
BATCHED_TOKENS, MAX_LOGPROBS = 1024, 3

_server: Any = None  # the shared server's actor handle while it runs


def init_local_ray() -> None:
    import ray

    ray.init(**LOCAL_RAY)


def init_ray_retrying(**kwargs) -> None:
    """``ray.init`` that tries once more when Ray's own head processes fail to start (seen on
    a loaded 2-core CI box: the GCS server died with "double free or corruption" and
    ``ray.init`` timed out waiting for its port file)."""
    import ray

    try:
        ray.init(**kwargs)
    except RuntimeError as err:
        if "Timed out waiting for file" not in str(err):
            raise
        logger.warning("ray.init failed (%s); starting Ray once more", err)
        ray.shutdown()
        ray.init(**kwargs)


def tiny_server_config(model: Path) -> Any:
    from servers import ServerConfig

    return ServerConfig(
        model=str(model),
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=BATCHED_TOKENS,
        enable_chunked_prefill=False,
        enforce_eager=True,
        engine_kwargs={"max_logprobs": MAX_LOGPROBS},
        max_n=MAX_N,
        max_tokens_per_request=MAX_TOKENS,
        max_prompt_tokens=MAX_PROMPT,
        max_concurrent_requests=MAX_SEQUENCES,
    )


def stop_tiny_server() -> None:
    global _server
    if _server is not None:
        from servers import stop_servers

        stop_servers([_server])
        _server = None


def stop_local_ray() -> None:
    """Stop the shared server and Ray (a no-op for what is not running)."""
    stop_tiny_server()
    if "ray" in sys.modules:  # imported lazily: the GPU machine has no Ray
        sys.modules["ray"].shutdown()


@pytest.fixture(scope="session")
def _shared_ray_session() -> Iterator[None]:
    """Whatever is still up when the session ends (under ``-x``, say) is stopped then."""
    yield
    stop_local_ray()


@pytest.fixture(scope="module")
def local_ray(_shared_ray_session) -> None:
    """Local Ray (``LOCAL_RAY``), started unless it already runs."""
    import ray

    if not ray.is_initialized():
        init_ray_retrying(**LOCAL_RAY)


@pytest.fixture(scope="module")
def tiny_server(local_ray, tiny_qwen3_path) -> Any:
    """The shared tiny-qwen3 ``AsyncServer`` actor (``tiny_server_config``). A module may not
    kill it; one that changes its weights puts the original ones back before it ends."""
    global _server
    if _server is None:
        from servers import launch_servers

        (_server,) = launch_servers(tiny_server_config(tiny_qwen3_path), 1, num_cpus=1)
    return _server


_SHARED = ("tiny_server", "local_ray")
_release_after: dict[str, pytest.Item] = {}  # fixture -> last item of its last user's module


def _module(item: pytest.Item) -> Any:
    return item.getparent(pytest.Module)


def _uses(item: pytest.Item, name: str) -> bool:
    return name in getattr(item, "fixturenames", ())  # every fixture it needs, direct or not


def _run_together(items: list[pytest.Item], name: str) -> None:
    """Move the modules with a test that uses fixture ``name`` (whole, so that their module
    fixtures start once) to where the first one stands, in order."""
    modules = {id(_module(item)) for item in items if _uses(item, name)}
    users = [item for item in items if id(_module(item)) in modules]
    if users:
        first = items.index(users[0])
        moved = {id(item) for item in users}
        others = [item for item in items if id(item) not in moved]
        items[:] = others[:first] + users + others[first:]


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that will run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that use Ray run one after another, and among them those that share the
    server: each is started once, and no other engine starts while the server idles."""
    _run_together(items, "local_ray")
    _run_together(items, "tiny_server")
    _release_after.clear()
    for i, item in enumerate(items):
        for name in _SHARED:
            if _uses(item, name):
                # the module's last item: its own fixtures may use the server until it ends
                end = i
                while end + 1 < len(items) and _module(items[end + 1]) is _module(item):
                    end += 1
                _release_after[name] = items[end]


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the module's fixtures
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last module that uses the shared server (or Ray), stop it."""
    if item is _release_after.get("tiny_server"):
        stop_tiny_server()
    if item is _release_after.get("local_ray"):
        stop_local_ray()
