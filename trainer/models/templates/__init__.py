"""Chat templates written by the project (Jinja, Hugging Face chat-template dialect).

One ChatML + tools template (``chatml_tools.jinja``) serves every asset; each asset fixes two
settings in a header: the default system prompt and whether Qwen3 ``<think>`` handling is on.
"""

from __future__ import annotations

import json
from importlib.resources import files

__all__ = ["TEMPLATE_SETTINGS", "read_template"]

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# name -> (default system prompt or None, Qwen3 think handling)
TEMPLATE_SETTINGS: dict[str, tuple[str | None, bool]] = {
    "qwen3": (None, True),
    "smollm2": (SMOLLM_SYSTEM, False),
}


def read_template(name: str) -> str:
    """The complete chat template for ``name`` (``qwen3`` or ``smollm2``)."""
    default_system, think_blocks = TEMPLATE_SETTINGS[name]
    system = "none" if default_system is None else json.dumps(default_system)
    header = (
        f"{{%- set default_system = {system} -%}}\n"
        f"{{%- set think_blocks = {str(think_blocks).lower()} -%}}\n"
    )
    return header + (files(__package__) / "chatml_tools.jinja").read_text()
