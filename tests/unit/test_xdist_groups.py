"""How ``make test`` cuts the process tiers into xdist work units (``tests/xdist_groups.py``),
on stand-in items: the shared-Ray modules first and together as one unit, the command-run
tiers next, every module whole; nothing changes outside an xdist worker."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests import xdist_groups
from tests.xdist_groups import GROUPS_ENV, SHARED_RAY_GROUP


@dataclass(eq=False)
class Item:
    nodeid: str
    fixturenames: tuple[str, ...] = ()


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


@dataclass(eq=False)
class Node:
    """A stand-in for xdist's WorkerController: what the scheduler reads and calls."""

    workerid: str
    shutting_down: bool = False

    def __post_init__(self) -> None:
        self.workerinput = {"workerid": self.workerid}
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def lanes(workers: int, modules: list[str]):
    """A scheduler over one test per module, with ``workers`` stand-in workers."""
    from collections import OrderedDict

    cls = xdist_groups._scheduler_class()
    scheduler = cls.__new__(cls)
    scheduler._groups = {}
    scheduler.numnodes = workers
    collection = [f"{m}::t" for m in modules]
    scheduler.workqueue = OrderedDict((m, {f"{m}::t": False}) for m in modules)
    nodes = [Node(f"gw{i}") for i in range(workers)]
    scheduler.assigned_work = {node: {} for node in nodes}
    scheduler.registered_collections = {node: collection for node in nodes}
    return scheduler, nodes, collection


MODULES = [
    "tests/e2e/test_a.py",
    "tests/integration/test_b.py",
    "tests/unit/test_c.py",
    "tests/unit/test_d.py",
]


def test_with_three_workers_the_last_runs_only_unit_modules_the_others_process_ones_first():
    scheduler, (gw0, gw1, gw2), collection = lanes(3, MODULES)
    scheduler._assign_work_unit(gw2)
    scheduler._assign_work_unit(gw0)
    scheduler._assign_work_unit(gw1)
    assert [collection[i] for (i,) in gw2.sent] == ["tests/unit/test_c.py::t"]
    assert [collection[i] for (i,) in gw0.sent] == ["tests/e2e/test_a.py::t"]
    assert [collection[i] for (i,) in gw1.sent] == ["tests/integration/test_b.py::t"]
    # no process module left: a process worker takes the next unit module
    scheduler._assign_work_unit(gw0)
    assert collection[gw0.sent[-1][0]] == "tests/unit/test_d.py::t"
    # nothing left for the unit lane: it is told to end after the tests it holds
    scheduler._reschedule(gw2)
    assert gw2.shutting_down and len(gw2.sent) == 1


def test_the_unit_lane_ends_while_process_modules_are_still_queued():
    scheduler, (_, _, gw2), _ = lanes(3, ["tests/e2e/test_a.py", "tests/e2e/test_b.py"])
    scheduler._reschedule(gw2)
    assert gw2.shutting_down and gw2.sent == []
    assert list(scheduler.workqueue) == ["tests/e2e/test_a.py", "tests/e2e/test_b.py"]


def test_with_two_workers_there_is_no_unit_lane():
    scheduler, (gw0, gw1), collection = lanes(2, list(reversed(MODULES)))
    scheduler._assign_work_unit(gw1)  # the last worker: any module, process ones first
    assert collection[gw1.sent[0][0]] == "tests/integration/test_b.py::t"
    assert not xdist_groups.unit_lane("gw1", 2) and xdist_groups.unit_lane("gw2", 3)
