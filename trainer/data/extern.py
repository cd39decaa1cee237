"""Load a user's class the way verl names it: ``pkg://package.module`` (or
``pkg://package/module``), ``file://path/to/file.py``, or a plain ``.py`` path (absolute, or
relative to the working directory), plus the class's name."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["load_extern"]

PKG = "pkg://"
FILE = "file://"


def load_extern(path: str, name: str, key: str) -> Any:
    """The object ``name`` of the module at ``path``; ``key`` (``data.custom_cls``) names the
    setting in every error, which says what failed."""
    if path.startswith(PKG):
        module_name = path[len(PKG) :].replace("/", ".").removesuffix(".py")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"{key}: cannot import {module_name!r} ({exc})") from exc
    else:
        file = Path(path[len(FILE) :] if path.startswith(FILE) else path).expanduser()
        if not file.is_file():
            raise ValueError(
                f"{key}: {path!r} is not a file; give a .py path, file://<path> or "
                "pkg://<package.module>"
            )
        unique = "agentloop_extern_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
        module = sys.modules.get(unique)
        if module is None:
            spec = importlib.util.spec_from_file_location(unique, file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[unique] = module  # dataclasses and pickling look modules up by name
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[unique]
                raise ValueError(
                    f"{key}: importing {path!r} raised {type(exc).__name__}: {exc}"
                ) from exc
    if not hasattr(module, name):
        raise ValueError(f"{key}: {path!r} has no {name!r}")
    return getattr(module, name)
