"""A user qwen-agent tool (registered with qwen-agent's decorator) for the wrapper tests."""

from __future__ import annotations

from qwen_agent.tools.base import BaseTool, register_tool


@register_tool("reverse_text")
class ReverseText(BaseTool):
    description = "Reverse a text."
    parameters = [
        {"name": "text", "type": "string", "description": "Text to reverse.", "required": True}
    ]

    def call(self, params, **kwargs) -> str:
        args = self._verify_json_format_args(params)
        return args["text"][::-1]
