"""Chat templates written by the project (Jinja, Hugging Face chat-template dialect)."""

from __future__ import annotations

from importlib.resources import files

__all__ = ["read_template"]


def read_template(name: str) -> str:
    """Text of ``templates/<name>.jinja`` (``qwen3`` or ``smollm2``)."""
    return (files(__package__) / f"{name}.jinja").read_text()
