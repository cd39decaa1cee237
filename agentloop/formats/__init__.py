"""Chat formats (``multi_turn.format``): per model family, the tool-call parser, the tokens
that end a model turn, and the history messages its chat template needs. Importing this
package registers the built-in families: hermes/qwen (Qwen2.5, Qwen3), llama3_json (Llama
3.1-3.3), mistral, gpt-oss (Harmony) and glm45 (GLM-4.5/4.6)."""

from agentloop.formats import glm as _glm  # noqa: F401  (registers glm45)
from agentloop.formats import gpt_oss as _gpt_oss  # noqa: F401  (registers gpt-oss)
from agentloop.formats import hermes as _hermes  # noqa: F401  (registers hermes, qwen)
from agentloop.formats import llama3 as _llama3  # noqa: F401  (registers llama3_json)
from agentloop.formats import mistral as _mistral  # noqa: F401  (registers mistral)
from agentloop.formats.base import (
    ChatFormat,
    EndTokens,
    content_message,
    detect_format,
    end_tokens,
    get_format,
    plain_tool_message,
    register_format,
    registered_formats,
    resolve_format,
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
    "registered_formats",
    "resolve_format",
]
