"""A model given by folder or by ``agentloop-models`` asset name, resolved to a folder."""

from __future__ import annotations

from pathlib import Path

from trainer.models.registry import MODELS, prepare

__all__ = ["resolve_model"]


def resolve_model(name_or_path: str, what: str = "--model") -> str:
    """A folder path as is; an ``agentloop-models`` asset name to its (prepared) cache folder.
    Raises ``ValueError`` naming ``what`` (the option or config key) otherwise."""
    if name_or_path in MODELS:
        return str(prepare(name_or_path))
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        known = ", ".join(sorted(MODELS))
        raise ValueError(
            f"{what} {name_or_path!r} is neither a model folder nor a known asset name ({known})"
        )
    return str(path)
