"""How ``make test`` cuts the process tiers into xdist work units (``tests/xdist_groups.py``),
on stand-in items: the shared-Ray modules first and together as one unit, the command-run
tiers next, every module whole; nothing changes outside an xdist worker."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from tests import xdist_groups
from tests.xdist_groups import GROUPS_ENV, SHARED_RAY_GROUP


@dataclass(frozen=True)
class Marker:
    kwargs: dict[str, float]


@dataclass(eq=False)
class Item:
    nodeid: str
    fixturenames: tuple[str, ...] = ()
    heavy_minutes: float | None = None  # marked heavy(minutes=...)

    def get_closest_marker(self, name: str) -> Marker | None:
        if name != "heavy" or self.heavy_minutes is None:
            return None
        return Marker({"minutes": self.heavy_minutes})


def session() -> list[Item]:
    return [
        Item("tests/integration/a/test_small.py::t1"),
        Item("tests/integration/b/test_ray1.py::t1", ("local_ray",)),
        Item("tests/integration/b/test_ray1.py::t2"),  # same module: goes with it
        Item("tests/e2e/test_cli.py::t1"),
        Item("tests/reliability/test_faults.py::t1"),
        Item("tests/reliability/test_ray2.py::t1", ("tiny_server", "local_ray")),
        Item("tests/integration/a/test_small.py::t2"),
    ]


@pytest.fixture()
def groups_file(tmp_path, monkeypatch):
    path = tmp_path / "groups.json"
    monkeypatch.setenv(GROUPS_ENV, str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    return path


def test_shared_ray_modules_first_then_command_tiers_then_integration(groups_file):
    items = session()
    xdist_groups.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/integration/b/test_ray1.py::t1",
        "tests/integration/b/test_ray1.py::t2",
        "tests/reliability/test_ray2.py::t1",
        "tests/reliability/test_faults.py::t1",
        "tests/e2e/test_cli.py::t1",
        "tests/integration/a/test_small.py::t1",
        "tests/integration/a/test_small.py::t2",
    ]
    assert json.loads(groups_file.read_text()) == {
        "tests/integration/b/test_ray1.py": SHARED_RAY_GROUP,
        "tests/reliability/test_ray2.py": SHARED_RAY_GROUP,
    }


def test_heavy_modules_come_right_after_the_shared_ray_block_longest_first(groups_file):
    """``make test-all``: the modules that take minutes are handed out before the rest, in
    the order of their marker's ``minutes``."""
    items = [
        *session(),
        Item("tests/e2e/test_long.py::t1", heavy_minutes=3),
        Item("tests/e2e/test_longer.py::t1", heavy_minutes=8),
    ]
    xdist_groups.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items][3:6] == [
        "tests/e2e/test_longer.py::t1",
        "tests/e2e/test_long.py::t1",
        "tests/reliability/test_faults.py::t1",
    ]


def test_the_scheduler_makes_one_unit_of_a_group_and_one_per_other_module(groups_file):
    groups_file.write_text(json.dumps({"tests/x/test_ray.py": SHARED_RAY_GROUP}))
    cls = xdist_groups._scheduler_class()
    scheduler = cls.__new__(cls)  # the scope split reads no scheduler state but the groups
    assert scheduler._split_scope("tests/x/test_ray.py::t[1]") == SHARED_RAY_GROUP
    assert scheduler._split_scope("tests/x/test_cli.py::t") == "tests/x/test_cli.py"


def test_outside_an_xdist_worker_the_order_stays(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv(GROUPS_ENV, str(tmp_path / "groups.json"))
    items = session()
    xdist_groups.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [item.nodeid for item in session()]
    assert not (tmp_path / "groups.json").exists()


def test_each_worker_gets_its_own_short_ray_temp_folder():
    assert xdist_groups.ray_tmpdir("gw0") != xdist_groups.ray_tmpdir("gw1")
    assert len(xdist_groups.ray_tmpdir("gw15")) < 20  # Ray's socket paths live under it


def test_a_worker_drops_the_address_of_a_cluster_a_killed_session_left(monkeypatch, tmp_path):
    stale = tmp_path / "ray" / "ray_current_cluster"
    stale.parent.mkdir()
    stale.write_text("192.0.2.2:37991")  # a dead cluster: ray.init() would try to join it
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setattr(xdist_groups, "ray_tmpdir", lambda worker: str(tmp_path))
    xdist_groups.pytest_configure(None)  # type: ignore[arg-type]
    assert not stale.exists() and os.environ["RAY_TMPDIR"] == str(tmp_path)
