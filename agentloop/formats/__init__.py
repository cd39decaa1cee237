"""Chat formats (``multi_turn.format``): per model family, the tool-call parser (beside its
format, built with ``ChatFormat.new_parser``), the tokens that end a model turn, and the
history messages its chat template needs. One registry holds them all; importing this package
registers the built-in families: hermes/qwen (Qwen2.5, Qwen3), llama3_json (Llama
3.1-3.3), mistral (tokenizer v3) and its variant mistral_v7 (v7+), gpt-oss (Harmony), glm45
(GLM-4.5/4.6) and its variant glm47 (GLM-4.7)."""

from agentloop.formats import glm as _glm  # noqa: F401  (registers glm45)
from agentloop.formats import gpt_oss as _gpt_oss  # noqa: F401  (registers gpt-oss)
from agentloop.formats import hermes as _hermes  # noqa: F401  (registers hermes, qwen)
from agentloop.formats import llama3 as _llama3  # noqa: F401  (registers llama3_json)
from agentloop.formats import mistral as _mistral  # noqa: F401  (registers mistral)
from agentloop.formats import mistral_v7 as _mistral_v7  # noqa: F401  (registers mistral_v7)
from agentloop.formats.base import (
    ChatFormat,
    EndTokens,
    content_message,
    detect_format,
    end_tokens,
    get_format,
    plain_tool_message,
    register_format,
    register_parser,
    registered_formats,
    resolve_format,
    variant_for,
)

__all__ = [
    "ChatFormat",
    "EndTokens",
    "content_message",
    "detect_format",
    "end_tokens",
    "get_format",
    "plain_tool_message",
    "register_format",
    "register_parser",
    "registered_formats",
    "resolve_format",
    "variant_for",
]
