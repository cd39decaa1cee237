"""The order and the release points of the shared Ray session and server (``tests/ray_local.py``),
on stand-in test items: the modules that use Ray run together, those that share the server
among them, and each is stopped after the last item of its last user's module."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests import ray_local


@dataclass(eq=False)
class Module:
    name: str


@dataclass(eq=False)
class Item:
    name: str
    module: Module
    fixturenames: tuple[str, ...] = ()

    def getparent(self, cls: type) -> Module:
        assert cls is pytest.Module
        return self.module


@pytest.fixture(autouse=True)
def _own_release_points(monkeypatch):
    """The session's own release points (the real modules') are left as they are."""
    monkeypatch.setattr(ray_local, "_release_after", {})


def session() -> list[Item]:
    a, b, c, d = (Module(n) for n in "abcd")
    return [
        Item("a1", a, ("local_ray",)),
        Item("b1", b),
        Item("c1", c),
        Item("c2", c, ("tiny_server", "local_ray")),
        Item("d1", d, ("local_ray",)),
        Item("d2", d),
    ]


def test_modules_that_use_ray_run_together_from_the_first_and_the_server_users_among_them():
    items = session()
    ray_local.pytest_collection_modifyitems(items)
    # c goes whole (c1 too), right after a; b, which does not use Ray, goes after them all
    assert [i.name for i in items] == ["a1", "c1", "c2", "d1", "d2", "b1"]


def test_the_server_users_move_next_to_each_other():
    m, n, o = Module("m"), Module("n"), Module("o")
    items = [
        Item("m1", m, ("tiny_server", "local_ray")),
        Item("n1", n, ("local_ray",)),
        Item("o1", o, ("tiny_server", "local_ray")),
    ]
    ray_local.pytest_collection_modifyitems(items)
    assert [i.name for i in items] == ["m1", "o1", "n1"]


def test_each_is_stopped_after_the_last_item_of_its_last_users_module(monkeypatch):
    items = session()
    ray_local.pytest_collection_modifyitems(items)
    stopped: list[tuple[str, str]] = []
    monkeypatch.setattr(ray_local, "stop_tiny_server", lambda: stopped.append(("server", at)))
    monkeypatch.setattr(ray_local, "stop_local_ray", lambda: stopped.append(("ray", at)))
    for i, item in enumerate(items):
        at = item.name
        ray_local.pytest_runtest_teardown(item, items[i + 1] if i + 1 < len(items) else None)
    assert stopped == [("server", "c2"), ("ray", "d2")]
