"""Importing a user's module by name in this process (verl's ``model.external_lib``), with an
error that says what to change."""

from __future__ import annotations

import importlib

__all__ = ["import_external_lib"]


def import_external_lib(module: str | None, key: str = "external_lib") -> None:
    """Import ``module`` (e.g. one that registers a custom architecture or tokenizer with
    transformers' Auto classes) before a model or tokenizer loads; None does nothing."""
    if not module:
        return
    try:
        importlib.import_module(module)
    except Exception as exc:  # any failure inside the user's module is reported the same way
        raise ValueError(
            f"{key}={module!r} could not be imported ({type(exc).__name__}: {exc}): install the "
            f"package that provides it or put its folder on PYTHONPATH, or set {key}=null"
        ) from exc
