"""The one loader of user code: each syntax it accepts, and each error text, exactly."""

from __future__ import annotations

import json
import sys

import pytest

from servers.user_code import (
    UserCodeError,
    import_external_lib,
    load_module,
    load_object,
)

SYNTAX = "path/to/file.py:name, package.module:name or package.module.name"


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A folder, the working directory, with a good file, one that raises and one whose
    import needs a package that is not installed."""
    (tmp_path / "mine.py").write_text("X = 1\n\n\ndef f():\n    return 2\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "needs.py").write_text("import agentloop_no_such_pkg\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_file_and_name_load_with_a_colon_or_apart(files):
    assert load_object("mine.py:f")() == 2
    assert load_object(str(files / "mine.py") + ":f")() == 2
    assert load_object("mine.py", "X") == 1
    assert load_object("file://mine.py", "X") == 1
    assert load_object("file://mine.py:f")() == 2


def test_a_module_and_name_load_with_a_colon_a_dot_or_apart():
    for ref, name in [("json:dumps", None), ("json.dumps", None), ("json", "dumps")]:
        assert load_object(ref, name) is json.dumps
    assert load_object("pkg://json", "dumps") is json.dumps
    assert load_module("pkg://json") is json and load_module("json") is json


def test_a_cached_file_runs_once_and_is_registered_by_name(files):
    module = load_module("mine.py")
    assert load_module(str(files / "mine.py")) is module
    assert sys.modules[module.__name__] is module
    assert module.__name__.startswith("agentloop_user_mine_")


def test_an_uncached_file_runs_anew_each_time_and_is_not_registered(files):
    first = load_module("mine.py", cache=False)
    (files / "mine.py").write_text("X = 3\n")
    second = load_module("mine.py", cache=False)
    assert (first.X, second.X) == (1, 3)
    assert sys.modules.get(second.__name__) is not second


def test_a_ref_that_names_no_object_is_refused_with_the_syntax():
    for ref in ["Calculator", "mine.py", "json:"]:
        with pytest.raises(UserCodeError) as info:
            load_object(ref, key="k")
        assert str(info.value) == f"k={ref!r}: names no object; write {SYNTAX}"


def test_a_missing_file_says_which_path_was_tried(files):
    with pytest.raises(UserCodeError) as info:
        load_object("nope.py:f", key="k")
    assert str(info.value) == (
        f"k='nope.py:f': there is no file {str(files / 'nope.py')!r}; point it at an existing "
        ".py file (a relative path starts at the working directory)"
    )
    with pytest.raises(UserCodeError) as info:
        load_object("nope.py", "f", key="r.path", name_key="r.name")
    assert str(info.value).startswith("r.path='nope.py': there is no file ")


def test_a_module_that_does_not_import_says_what_to_install():
    with pytest.raises(UserCodeError) as info:
        load_object("agentloop_no_such_pkg.mod:f", key="k")
    assert str(info.value) == (
        "k='agentloop_no_such_pkg.mod:f': cannot import module 'agentloop_no_such_pkg.mod' "
        "(ModuleNotFoundError: No module named 'agentloop_no_such_pkg'); install the package "
        "that provides 'agentloop_no_such_pkg', put its folder on PYTHONPATH, or correct the name"
    )


def test_a_file_that_raises_on_import_says_what_it_raised(files):
    with pytest.raises(UserCodeError) as info:
        load_object("broken.py:f")
    assert str(info.value) == (
        f"'broken.py:f': importing file {str(files / 'broken.py')!r} raised RuntimeError: boom; "
        "fix that error there"
    )
    assert not [m for m in sys.modules if m.startswith("agentloop_user_broken_")]
    with pytest.raises(UserCodeError) as info:
        load_object("needs.py:f")
    assert str(info.value) == (
        f"'needs.py:f': importing file {str(files / 'needs.py')!r} raised ModuleNotFoundError: "
        "No module named 'agentloop_no_such_pkg'; install the package that provides "
        "'agentloop_no_such_pkg' or put its folder on PYTHONPATH"
    )


def test_a_missing_name_names_the_file_or_module_and_the_name_key(files):
    mine = repr(str(files / "mine.py"))
    cases = [
        (("mine.py:g",), {"key": "k"}, f"k='mine.py:g': file {mine} defines no 'g'; define it "
         "there or name one it defines"),
        (("mine.py", "g"), {"key": "r.path", "name_key": "r.name"}, f"r.path='mine.py', "
         f"r.name='g': file {mine} defines no 'g'; define it there or set r.name to a name it "
         "defines"),
        (("mine.py", "g"), {}, f"'mine.py' (name 'g'): file {mine} defines no 'g'; define it "
         "there or name one it defines"),
        (("json.nope",), {}, "'json.nope': module 'json' defines no 'nope'; define it there or "
         "name one it defines"),
    ]  # fmt: skip
    for args, kwargs, message in cases:
        with pytest.raises(UserCodeError) as info:
            load_object(*args, **kwargs)
        assert str(info.value) == message


def test_a_value_that_cannot_be_called_is_refused_when_a_callable_is_needed(files):
    assert load_object("mine.py:X") == 1
    with pytest.raises(UserCodeError) as info:
        load_object("mine.py:X", key="k", need_callable=True)
    assert str(info.value) == (
        f"k='mine.py:X': 'X' in file {str(files / 'mine.py')!r} is not callable (it is of type "
        "int); name a function or class"
    )


def test_an_external_lib_is_imported_by_module_name_and_none_does_nothing():
    import_external_lib(None)
    import_external_lib("json")
    with pytest.raises(UserCodeError) as info:
        import_external_lib("agentloop_no_such_pkg", "model.external_lib")
    assert str(info.value).startswith(
        "model.external_lib='agentloop_no_such_pkg': cannot import module 'agentloop_no_such_pkg'"
    )


def test_the_error_is_a_value_error():
    assert issubclass(UserCodeError, ValueError)
