"""Packages whose ``__init__`` loads its public names lazily (PEP 562) list them three times:
imports under ``TYPE_CHECKING`` (for type checkers), the table ``__getattr__`` loads from, and
``__all__`` (a literal, for ruff). Nothing at import time compares them, so this test does:
the three lists name the same names from the same modules, and every name resolves."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable
from types import ModuleType

import pytest

LAZY_TABLES: dict[str, Callable[[ModuleType], dict[str, str]]] = {
    "servers": lambda m: dict(m._HOMES),
    "trainer.config": lambda m: dict.fromkeys(m._SCHEMA_NAMES, "trainer.config.schema"),
}
"""Each package and its lazy table as ``{name: module it loads from}``."""


def read_init(source: str) -> tuple[dict[str, str], list[str], set[str]]:
    """From an ``__init__``'s source: ``{name: module}`` of its ``TYPE_CHECKING`` imports, its
    ``__all__``, and the public names it defines itself (functions, classes, assignments)."""
    typing: dict[str, str] = {}
    exported: list[str] = []
    defined: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, ast.unparse(stmt)
                typing.update({a.asname or a.name: stmt.module for a in stmt.names})
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if "__all__" in names:
                exported = ast.literal_eval(node.value)
            defined |= names
    return typing, exported, {n for n in defined if not n.startswith("_")}


def disagreements(
    typing: dict[str, str], lazy: dict[str, str], exported: list[str], defined: set[str]
) -> list[str]:
    """What the three lists disagree on, one line per name."""
    problems = [
        f"{name}: TYPE_CHECKING imports it from {typing.get(name)}, the lazy table loads it "
        f"from {lazy.get(name)}"
        for name in sorted(typing.keys() | lazy.keys())
        if typing.get(name) != lazy.get(name)
    ]
    problems += [
        f"{name}: loaded lazily but not in __all__" for name in sorted(lazy.keys() - {*exported})
    ]
    problems += [
        f"{name}: in __all__ but neither loaded lazily nor defined in the module"
        for name in sorted({*exported} - lazy.keys() - defined)
    ]
    problems += [
        f"{name}: twice in __all__"
        for name in sorted({n for n in exported if exported.count(n) > 1})
    ]
    return problems


def lists_of(
    package: str,
) -> tuple[ModuleType, dict[str, str], list[str], dict[str, str], set[str]]:
    module = importlib.import_module(package)
    typing, exported, defined = read_init(inspect.getsource(module))
    return module, typing, exported, LAZY_TABLES[package](module), defined


@pytest.mark.parametrize("package", sorted(LAZY_TABLES))
def test_type_checking_imports_lazy_table_and_all_name_the_same_names(package):
    module, typing, exported, lazy, defined = lists_of(package)
    assert exported == module.__all__  # the source was read, not an empty list
    assert lazy, f"{package} has no lazy names: drop it from LAZY_TABLES"
    assert disagreements(typing, lazy, exported, defined) == []


@pytest.mark.parametrize("package", sorted(LAZY_TABLES))
def test_every_exported_name_resolves_and_lazy_ones_to_their_home_modules_object(package):
    module, _, exported, lazy, _ = lists_of(package)
    for name in exported:
        assert getattr(module, name) is not None
    for name, home in lazy.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize("package", sorted(LAZY_TABLES))
@pytest.mark.parametrize("missing_from", ["TYPE_CHECKING", "lazy table", "__all__"])
def test_the_check_names_a_name_missing_from_any_one_list(package, missing_from):
    """Control: the check is not blind. One lazy name dropped from one list is reported."""
    _, typing, exported, lazy, defined = lists_of(package)
    name = sorted(lazy)[0]
    if missing_from == "TYPE_CHECKING":
        del typing[name]
    elif missing_from == "lazy table":
        del lazy[name]
    else:
        exported.remove(name)
    problems = disagreements(typing, lazy, exported, defined)
    assert problems and all(p.startswith(f"{name}: ") for p in problems), problems


def test_the_check_names_a_name_imported_from_another_module_than_it_is_loaded_from():
    _, typing, exported, lazy, defined = lists_of("servers")
    typing["TokenOutput"] = "servers.manager"
    assert disagreements(typing, lazy, exported, defined) == [
        "TokenOutput: TYPE_CHECKING imports it from servers.manager, the lazy table loads it "
        "from servers.types"
    ]


def test_the_reader_finds_the_type_checking_imports_in_source():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.a import A, B as C\n"
        "__all__ = ['A', 'C', 'f']\n"
        "def f(): ...\n"
        "def _g(): ...\n"
    )
    assert read_init(source) == ({"A": "pkg.a", "C": "pkg.a"}, ["A", "C", "f"], {"f"})
