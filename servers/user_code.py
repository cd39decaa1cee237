"""The one loader of user code: reward functions, tools, agent loops, interactions, estimators
and losses, datasets and samplers, external libraries, the studio's files.

Every config value that names user code takes the same syntax (docs/user-code.md):

- ``path/to/file.py:name``: a Python file (absolute, or relative to the working directory) and
  the object ``name`` in it;
- ``package.module:name``: an importable module and the object in it;
- ``package.module.name``: the same, dotted (the last dot splits module from name);
- verl's split keys (``custom_reward_function.path`` / ``.name``, ``data.custom_cls.path`` /
  ``.name``) give the file or module and the name apart; there ``pkg://package.module`` and
  ``file://path.py`` are accepted as verl accepts them.

It lives in ``servers`` because the servers import external libraries too and import neither
``agentloop`` nor ``trainer``; those two re-use it. Each failure raises ``UserCodeError`` (a
``ValueError``) whose text says what was given (under the config key, when the caller names
one), what was tried, and what to change.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["UserCodeError", "import_external_lib", "load_module", "load_object"]

PKG = "pkg://"
FILE = "file://"
PREFIX = "agentloop_user_"
"""The start of the module name a file is loaded under."""
SYNTAX = "path/to/file.py:name, package.module:name or package.module.name"


class UserCodeError(ValueError):
    """User code named in a config could not be loaded; the text says what to change."""


def load_object(
    ref: str,
    name: str | None = None,
    *,
    key: str | None = None,
    name_key: str | None = None,
    need_callable: bool = False,
    cache: bool = True,
) -> Any:
    """The object ``ref`` names (``file.py:name``, ``module:name``, ``package.module.name``),
    or, when ``name`` is given apart (verl's split keys), the object ``name`` of the file or
    module ``ref``. ``key`` and ``name_key`` are the config keys named in errors;
    ``need_callable`` refuses what cannot be called; ``cache`` as in ``load_module``."""
    if name is None:
        subject = _subject(ref, key)
        ref, name = _split(ref, subject)
        module = _load_module(ref, subject, key, cache)
    else:
        module = _load_module(ref, _subject(ref, key), key, cache)
        subject = f"{key}={ref!r}" if key else repr(ref)
        subject = f"{subject}, {name_key}={name!r}" if name_key else f"{subject} (name {name!r})"
    if not hasattr(module, name):
        fix = f"set {name_key} to a name it defines" if name_key else "name one it defines"
        raise UserCodeError(
            f"{subject}: {_source(module)} defines no {name!r}; define it there or {fix}"
        )
    found = getattr(module, name)
    if need_callable and not callable(found):
        raise UserCodeError(
            f"{subject}: {name!r} in {_source(module)} is not callable (it is of type "
            f"{type(found).__name__}); name a function or class"
        )
    return found


def load_module(ref: str, *, key: str | None = None, cache: bool = True) -> ModuleType:
    """The module ``ref`` names: a ``.py`` file (``file://`` optional; relative to the working
    directory) or an importable module (``pkg://`` optional). With ``cache`` a file is
    executed once and kept in ``sys.modules`` under a name made from its absolute path
    (dataclasses and pickling look modules up by name); without, it is executed anew on each
    call and not registered (a file edited between loads, functions pickled by value)."""
    return _load_module(ref, _subject(ref, key), key, cache)


def _load_module(ref: str, subject: str, key: str | None, cache: bool) -> ModuleType:
    if ref.startswith(PKG):
        return _import(ref[len(PKG) :].replace("/", ".").removesuffix(".py"), subject, key)
    if _is_file_ref(ref):
        return _exec_file(Path(ref.removeprefix(FILE)).expanduser(), subject, cache)
    return _import(ref, subject, key)


def import_external_lib(module: str | None, key: str = "external_lib") -> None:
    """Import ``module`` (verl's ``model.external_lib``: one that registers a custom
    architecture or tokenizer with transformers' Auto classes) before a model or tokenizer
    loads; None does nothing."""
    if module:
        load_module(module, key=key)


def _subject(given: str, key: str | None) -> str:
    return f"{key}={given!r}" if key else repr(given)


def _split(ref: str, subject: str) -> tuple[str, str]:
    """``file.py:name`` / ``module:name`` / ``package.module.name`` -> (where, name)."""
    where, sep, name = ref.rpartition(":")
    if not (sep and where and name.isidentifier()):
        where, sep, name = ref.rpartition(".")
        if _is_file_ref(ref) or not (sep and where and name.isidentifier()):
            raise UserCodeError(f"{subject}: names no object; write {SYNTAX}")
    return where, name


def _is_file_ref(ref: str) -> bool:
    """A file path rather than a module name: ``file://``, a ``.py`` suffix, a path separator,
    or an existing file."""
    if ref.startswith(FILE) or ref.endswith(".py") or "/" in ref or "\\" in ref:
        return True
    return Path(ref).expanduser().is_file()


def _import(module: str, subject: str, key: str | None) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise UserCodeError(
            f"{subject}: cannot import module {module!r} (ModuleNotFoundError: {exc}); "
            f"install the package that provides {exc.name!r}, put its folder on PYTHONPATH, "
            "or correct the name"
        ) from exc
    except Exception as exc:  # any failure inside the user's module is reported the same way
        raise _raised(subject, f"module {module!r}", exc) from exc


def _exec_file(file: Path, subject: str, cache: bool) -> ModuleType:
    file = file.absolute()
    if not file.is_file():
        raise UserCodeError(
            f"{subject}: there is no file {str(file)!r}; point it at an existing .py file "
            "(a relative path starts at the working directory)"
        )
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    unique = f"{PREFIX}{file.stem}_{digest}"
    if cache and unique in sys.modules:
        return sys.modules[unique]
    spec = importlib.util.spec_from_file_location(unique, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if cache:
        sys.modules[unique] = module  # before executing, as import does (dataclasses need it)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report what broke
        if cache:
            del sys.modules[unique]
        raise _raised(subject, f"file {str(file)!r}", exc) from exc
    return module


def _raised(subject: str, source: str, exc: BaseException) -> UserCodeError:
    if isinstance(exc, ModuleNotFoundError):
        fix = f"install the package that provides {exc.name!r} or put its folder on PYTHONPATH"
    else:
        fix = "fix that error there"
    return UserCodeError(f"{subject}: importing {source} raised {type(exc).__name__}: {exc}; {fix}")


def _source(module: ModuleType) -> str:
    """How an error names where a name was looked up: the file, or the module."""
    if module.__name__.startswith(PREFIX):
        return f"file {module.__file__!r}"
    return f"module {module.__name__!r}"
