"""The integration, reliability and e2e tiers on two xdist workers (``make test``).

Most of those modules start whole processes (an engine, a Ray, a CLI run) that leave a core
idle while they wait on each other: one after another they kept 1.15 of the two cores busy.
Under ``--dist loadfile`` two workers run two modules side by side, each module whole on one
worker (its module fixtures start once), and this plugin adds:
- the modules that share the Ray session and tiny-qwen3 server (``tests/ray_local.py``) are
  one work unit, run first and in their order, so Ray and the server start once, on one
  worker. Only a worker knows which modules those are (their fixtures); it writes the module
  groups to a file the controller's scheduler (``ModuleGroupScheduling``) reads when it cuts
  the collection into units;
- the `heavy` modules (``make test-all``) come next, longest first (``heavy(minutes=...)``);
- the modules that start whole command runs (reliability, e2e) come next, the shorter
  integration modules last, so that the end of the run is not one long module alone (with
  ``--no-loadscope-reorder``: xdist orders units by their number of tests otherwise);
- each worker has its own Ray temp folder (``RAY_TMPDIR``): a ``cluster_utils`` cluster
  writes its address there, and a plain ``ray.init()`` (a CLI run on the other worker) would
  otherwise join that cluster instead of starting its own.

(xdist's own ``--dist loadgroup`` would do the grouping, but it renames test ids through an
attribute pytest 9 no longer reads.) Without ``-n`` nothing here changes the order.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "GROUPS_ENV",
    "SHARED_RAY_GROUP",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_unconfigure",
    "pytest_xdist_make_scheduler",
    "ray_tmpdir",
]

SHARED_RAY_GROUP = "shared-ray"
GROUPS_ENV = "AGENTLOOP_XDIST_GROUPS"  # the file a worker writes the module groups to
# Tiers in the order their modules are handed out: whole command runs first.
_TIER_ORDER = ("reliability", "e2e", "integration")


def ray_tmpdir(worker: str) -> str:
    """The Ray temp folder of xdist worker ``worker`` (short: Ray's socket paths live under it
    and a Unix socket path has at most 107 characters)."""
    return f"/tmp/ray-{worker}"


def _is_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _xdist_controller(config: pytest.Config) -> bool:
    return not _is_worker() and config.getoption("dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    """The controller picks the groups file (before it starts the workers, which inherit the
    environment); a worker takes its own Ray temp folder, inherited by its CLI runs' Rays."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "RAY_TMPDIR" not in os.environ:
        os.environ["RAY_TMPDIR"] = tmpdir = ray_tmpdir(worker)
        # A session killed during a cluster test leaves that cluster's address here, and a
        # plain ray.init() would then try to join the dead cluster. The folder is this
        # worker's alone, so nothing live is behind a file found at its start.
        Path(tmpdir, "ray", "ray_current_cluster").unlink(missing_ok=True)
    elif _xdist_controller(config):
        handle, path = tempfile.mkstemp(prefix="xdist-groups-", suffix=".json")
        os.close(handle)
        os.environ[GROUPS_ENV] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    if _xdist_controller(config) and GROUPS_ENV in os.environ:
        Path(os.environ.pop(GROUPS_ENV)).unlink(missing_ok=True)


def _module_path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _tier_rank(module: str) -> int:
    parts = module.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return _TIER_ORDER.index(tier) if tier in _TIER_ORDER else len(_TIER_ORDER)


# tryfirst: before tests/ray_local.py's hook (trylast), which then keeps the shared-Ray block
# where this puts it and computes its stop points on the final order.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(GROUPS_ENV)
    if not _is_worker() or not path:
        return
    shared = {
        _module_path(item) for item in items if "local_ray" in getattr(item, "fixturenames", ())
    }

    # Stable sort: the shared-Ray modules keep their order among themselves, and every module
    # its own tests' order.
    # The `heavy` modules (minutes each; `make test-all` runs them with the rest) come right
    # after the shared-Ray block, longest first (their marker's ``minutes``), so that no long
    # one ends the run.
    heavy: dict[str, float] = {}
    for item in items:
        marker = item.get_closest_marker("heavy")
        if marker is not None:
            heavy[_module_path(item)] = float(marker.kwargs.get("minutes", 0))

    def key(item: pytest.Item) -> tuple[int, float]:
        module = _module_path(item)
        if module in shared:
            return (0, 0)
        return (1, -heavy[module]) if module in heavy else (2, _tier_rank(module))

    items.sort(key=key)
    groups = {module: SHARED_RAY_GROUP for module in sorted(shared)}
    # Both workers collect the same tests and write the same groups: a whole-file rename keeps
    # the controller from reading half of one.
    tmp = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
    Path(tmp).write_text(json.dumps(groups))
    os.replace(tmp, path)


def _scheduler_class() -> type:
    """``ModuleGroupScheduling``, built when asked for: xdist is imported only where used."""
    from xdist.scheduler import LoadFileScheduling

    class ModuleGroupScheduling(LoadFileScheduling):
        """``loadfile`` with the modules the workers grouped as one work unit each."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            if self._groups is None:  # read once, after every worker has collected
                path = os.environ.get(GROUPS_ENV, "")
                text = Path(path).read_text() if path and Path(path).exists() else ""
                self._groups = json.loads(text) if text else {}
            return self._groups.get(module, module)

    return ModuleGroupScheduling


# optionalhook: the GPU machine's pytest has no xdist, and no such hook to check this against.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``: files whole on a worker, the grouped modules as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    return _scheduler_class()(config, log)
